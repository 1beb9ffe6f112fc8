"""A method's first phase (RetireOPD trains its frozen teacher) chooses on valid only: it never
plays the test split, which the run that reports it reads once at its end."""

from __future__ import annotations

from pipeline.methods import build_method
from pipeline.orchestration.phases import run_prerequisite
from pipeline.tools.cli import compose


def test_the_first_phase_plays_no_final_split(tmp_path):
    cfg = compose(["model=tiny", "+experiment=search_qa_warm_start", "method=retire_opd", "method.phase1_steps=2"])
    assert cfg.trainer.final_val_splits == ["test"]
    method = build_method(dict(cfg.method), invalid_action_penalty=0.01, env_name=cfg.env.name)
    seen = []

    def train(cfg1, phase_dir):  # a FAKE training run: records its config, leaves a final model
        seen.append(cfg1)
        (phase_dir / "checkpoints" / "step_000002" / "hf").mkdir(parents=True)
        return [{"val/success": 0.5}]

    run_prerequisite(cfg, method, tmp_path, train)
    [cfg1] = seen
    assert cfg1.trainer.final_val_splits == [] and cfg1.trainer.total_steps == 2
    assert cfg.trainer.final_val_splits == ["test"]  # the second phase still reads it, once
    assert method.teacher_success_rate == 0.5
