"""Learning from a warm start: SmolLM2-135M-Instruct first clones the keyword task's expert with
the real warm-start stage (DeepSpeed learner, NLL on the expert's replies, cached checkpoint), on
an instruction that no longer shows the answer format (``hint_format=false``): only the clone
knows ``<answer>word</answer>``, and it writes it some of the time. GRPO from that checkpoint then
raises the success on held-out words (the validation and test splits share no word with train,
tests/unit/test_split_keyword.py), sampled at temperature 1 (real Ray actors, DeepSpeed learner,
HF engine).

Search-QA's warm start + GRPO is the larger run (docs/results.md); its smallest version that we
tried for CI did not learn in 8 steps and took 13 minutes, so CI runs this one.
"""

import pytest

from pipeline.orchestration.run import run_training
from pipeline.tools.cli import compose
from pipeline.tools.sweep_report import read_rows

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.extended]

# conf/experiment/keyword_warm_start.yaml: the fp32 clone of 8 tasks x 2 epochs, 10 GRPO steps of
# 2 x 8, validation sampled at T=1 on 64 held-out tasks; here only before the first step and after
# the last.
OVERRIDES = ["+experiment=keyword_warm_start", "trainer.val_every=10", "logger.progress=false"]


def test_grpo_raises_the_success_of_a_warm_started_model(ray_local, tmp_path):
    cfg = compose([*OVERRIDES, f"warm_start.cache_dir={tmp_path / 'clones'}"])
    run_training(cfg, tmp_path / "run")
    rows = read_rows(tmp_path / "run")  # the validation before the first step is step 0's row
    val = [r["val/success"] for r in rows if r.get("val/success") is not None]
    train = [round(r["rollout/success"], 3) for r in rows if "rollout/success" in r]
    print("validation success (start, end):", val, "train success per step:", train)
    assert len(val) == 2, val
    start, end = val
    # The clone writes the block on the words it was cloned on, some of the time (so GRPO's first
    # groups hold wins), hardly ever on a held-out word; GRPO makes it the habit on every word. It
    # is cloned in fp32 on every CPU (in bf16 it landed at 0.66 natively and 0.97 in fp32 on AVX2,
    # on the earlier 20-word task). Measured on one AMD EPYC (avx512_bf16), held-out words:
    # 0.016 -> 0.969, train success 0.19 at the first step.
    assert start <= 0.8, val  # room to learn
    assert max(train[:2]) > 0, train  # the clone gives GRPO wins to learn from
    assert end >= start + 0.15, val
    test = [r["final/test/success"] for r in rows if r.get("final/test/success") is not None]
    assert len(test) == 1 and test[0] >= start + 0.15, test  # the test split, read once at the end
