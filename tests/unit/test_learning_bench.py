"""scripts/bench/learning.py's summary on hand-made runs: mean +- std over seeds, steps to reach
GRPO's final success, diagnostics, the picture."""
from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("learning_bench", ROOT / "scripts" / "bench" / "learning.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def _rows(curve, gate=None):
    rows = [{"step": s, "val/success": v, "rollout/success": v} for s, v in enumerate(curve)]
    if gate is not None:
        rows[-1]["sdar/gate_mean"] = gate
        rows[-1]["sdar/negative_gap_fraction"] = 1 - gate
    return rows


def test_the_table_averages_seeds_and_finds_when_a_method_reaches_grpo(tmp_path):
    points = [
        {"method": "grpo", "seed": 0, "rows": _rows([0.1, 0.2, 0.3]), "seconds": 60},
        {"method": "grpo", "seed": 1, "rows": _rows([0.1, 0.2, 0.5]), "seconds": 120},
        {"method": "sdar_hints", "seed": 0, "rows": _rows([0.1, 0.5, 0.6], gate=0.4), "seconds": 60},
        {"method": "sdar_hints", "seed": 1, "rows": _rows([0.1, 0.3, 0.6], gate=0.6), "seconds": 60},
        {"method": "gigpo", "seed": 0, "error": "exit 1", "rows": []},
    ]
    table = bench.summarise(points, tmp_path)
    by = {r["method"]: r for r in table}
    assert table[0]["method"] == "sdar_hints"  # best final success first
    assert by["grpo"]["final val/success"] == "0.400 ± 0.141"
    assert by["sdar_hints"]["steps to grpo's final"] == "1"  # mean 0.4 at step 1 reaches grpo's 0.4
    assert by["sdar_hints"]["paired final - grpo"] == "0.200 ± 0.141"  # 0.6-0.3 and 0.6-0.5, seed by seed
    assert by["grpo"]["paired final - grpo"] == ""
    assert by["sdar_hints"]["mean val/success after the start"] == "0.500 ± 0.071"  # (0.5+0.6)/2, (0.3+0.6)/2
    assert by["sdar_hints"]["gate_mean"] == "0.500 ± 0.141"
    assert by["sdar_hints"]["neg_gap_frac"] == "0.500 ± 0.141"  # the loss logs negative_gap_fraction
    assert by["gigpo"]["seeds"] == 0 and by["gigpo"]["failed"] == 1
    assert "test success (end)" not in by["grpo"]  # no run evaluated a final split
    with open(tmp_path / "learning.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    assert (tmp_path / "learning.png").stat().st_size > 1000
    assert "| sdar_hints |" in (tmp_path / "learning.md").read_text()


def test_a_final_split_gets_its_own_column(tmp_path):
    points = []
    for seed, end in ((0, 0.5), (1, 0.7)):
        rows = _rows([0.1, 0.3])
        rows[-1]["final/test/success"] = end
        points.append({"method": "grpo", "seed": seed, "rows": rows, "seconds": 60})
    [row] = bench.summarise(points, tmp_path)
    assert row["test success (end)"] == "0.600 ± 0.141"


def test_a_finished_point_loses_its_checkpoints_unless_kept_with_a_fake_train_process(tmp_path, monkeypatch):
    """run_point around a stand-in for scripts/train.py (a function writing what a run writes)."""
    import json

    def fake_run(cmd, cwd):
        run_dir = Path(next(a for a in cmd if a.startswith("trainer.run_dir=")).split("=", 1)[1])
        (run_dir / "checkpoints" / "step_2").mkdir(parents=True)
        (run_dir / "checkpoints" / "step_2" / "model.safetensors").write_bytes(b"0" * 1024)
        (run_dir / "phase1_teacher" / "checkpoints" / "step_1").mkdir(parents=True)  # RetireOPD's phase 1
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/success": 0.5}) + "\n")
        (run_dir / "summary.json").write_text(json.dumps({"seconds": 3.0}))
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(bench.subprocess, "run", fake_run)
    p = bench.run_point(tmp_path, "grpo", 0, [])
    assert p["rows"] == [{"step": 0, "val/success": 0.5}] and p["seconds"] == 3.0
    assert not (tmp_path / "grpo_s0" / "checkpoints").exists()
    assert not (tmp_path / "grpo_s0" / "phase1_teacher" / "checkpoints").exists()
    assert (tmp_path / "grpo_s0" / "phase1_teacher").is_dir()  # its metrics stay
    bench.run_point(tmp_path, "grpo", 1, [], keep_checkpoints=True)
    assert (tmp_path / "grpo_s1" / "checkpoints" / "step_2" / "model.safetensors").exists()
    assert (tmp_path / "grpo_s1" / "phase1_teacher" / "checkpoints" / "step_1").is_dir()


def test_every_preset_point_is_a_valid_config():
    """Each method of each preset, with its method overrides, passes the launch checks."""
    import pytest

    from pipeline.orchestration.run import check_launch
    from pipeline.tools.cli import compose

    for name, preset in bench.PRESETS.items():
        for m in preset["methods"]:
            extra = preset.get("method_overrides", {}).get(m, [])
            try:
                cfg = compose([f"method={m}", *preset["overrides"], *extra])
                check_launch(cfg)
            except Exception as err:  # noqa: BLE001 - name the point that fails
                pytest.fail(f"preset {name}, method {m}: {err}")
            assert cfg.method["name"] == m
