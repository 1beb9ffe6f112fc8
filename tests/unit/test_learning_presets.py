"""Every preset of scripts/bench/learning.py composes and validates for each of its methods, as its
points will be launched: a typo in a preset fails here, not hours into a comparison."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from pipeline.tools.cli import compose

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "scripts" / "bench" / "learning.py")
learning = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learning)

POINTS = [(name, method) for name, preset in sorted(learning.PRESETS.items()) for method in preset["methods"]]


@pytest.mark.parametrize("preset, method", POINTS, ids=[f"{p}-{m}" for p, m in POINTS])
def test_each_point_of_each_preset_composes_and_validates(preset, method, tmp_path):
    p = learning.PRESETS[preset]
    extra = p.get("method_overrides", {}).get(method, [])
    # as learning.py launches a point: in a run directory of its own, resumed if stopped
    cfg = compose([f"method={method}", *p["overrides"], *extra, f"trainer.run_dir={tmp_path}", "trainer.resume=auto"])
    assert cfg.method["name"] == method


def test_the_chat_preset_is_make_trains_recipe_in_the_chat_format(tmp_path):
    run = [f"trainer.run_dir={tmp_path}"]
    cfg = compose(["method=grpo", *learning.PRESETS["search_qa_chat"]["overrides"], *run])
    plain = compose(["method=grpo", *learning.PRESETS["search_qa_methods"]["overrides"], *run])
    assert cfg.env.prompt_format == "chat" and plain.env.prompt_format == "template"
    assert cfg.trainer.total_steps == plain.trainer.total_steps and cfg.env.name == plain.env.name == "search_qa"
