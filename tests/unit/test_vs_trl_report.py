"""scripts/bench/vs_trl.py without TRL: the workload both sides compose, the prompts both get, and
the report's arithmetic (rates over the measured steps, ratios per completion and per token)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from lab import trl_report

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("vs_trl", ROOT / "scripts" / "bench" / "vs_trl.py")
vs_trl = sys.modules["vs_trl"] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
spec.loader.exec_module(vs_trl)


def test_the_workload_config_sets_what_trl_is_given_too():
    w = vs_trl.Workload(model="tiny", steps=3, prompts=2, generations=3, new_tokens=8, precision="fp32")
    cfg = vs_trl.workload_config(w, lag=1)
    assert (cfg.trainer.groups_per_step, cfg.rollout.group_size, cfg.rollout.max_new_tokens) == (2, 3, 8)
    assert cfg.learner.precision == cfg.rollout.precision == "fp32" and cfg.trainer.max_policy_lag == 1
    # TRL has no entropy bonus and no reference model; its schedule and checkpointing are set to these
    assert cfg.learner.entropy_coef == 0 and cfg.learner.kl_coef == 0
    assert cfg.learner.lr_schedule == "constant" and not cfg.learner.gradient_checkpointing
    assert cfg.trainer.val_every == 0 and not cfg.trainer.skip_zero_advantage_rows


def test_the_prompts_are_the_first_tasks_of_privy_rls_training_stream(tiny_model_dir):
    from pipeline.orchestration.controller import task_seed

    cfg = vs_trl.workload_config(vs_trl.Workload(model="tiny", steps=2, prompts=3))
    tasks = vs_trl.training_prompts(cfg, 6)
    assert [t["task_seed"] for t in tasks] == [task_seed(cfg.trainer.seed, i) for i in range(6)]
    assert all(t["messages"][-1]["role"] == "user" and t["ids"] for t in tasks)
    again = vs_trl.training_prompts(cfg, 6)
    assert vs_trl.prompts_digest([t["ids"] for t in tasks]) == vs_trl.prompts_digest([t["ids"] for t in again])


def _raw(step_s, tokens, n=4):
    return {
        "step_s": step_s,
        "completions": [n] * len(step_s),
        "response_tokens": tokens,
        "reward_mean": 0.5,
        "threads": 2,
        "stop_ids": [2],
        "prompts_sha256": "ab" * 32,
    }


def test_rates_leave_out_the_first_step_and_ratios_come_per_completion_and_per_token():
    trl = trl_report.summarize(_raw([9.0, 2.0, 2.0], [100, 40, 40]))  # 10 tokens per completion
    privy = trl_report.summarize(_raw([9.0, 1.0, 3.0], [100, 80, 80]))  # 20 tokens per completion
    assert trl["measured_steps"] == 2 and trl["step_s_median"] == 2.0
    assert trl["completions_per_s"] == pytest.approx(8 / 4) and trl["response_tokens_per_s"] == pytest.approx(80 / 4)
    assert trl["mean_completion_tokens"] == 10 and privy["mean_completion_tokens"] == 20
    r = trl_report.ratios(privy, trl)
    assert r["per_completion"] == pytest.approx(1.0) and r["per_response_token"] == pytest.approx(2.0)


def test_the_markdown_names_the_cpu_the_command_and_both_ratios():
    trl = trl_report.summarize(_raw([9.0, 2.0], [100, 40]))
    privy = trl_report.summarize(_raw([9.0, 1.0], [100, 60]))
    report = {
        "date": "2026-12-04T00:00:00+00:00",
        "command": "python scripts/bench/vs_trl.py --steps 2",
        "git": {"commit": "0" * 40, "dirty": True, "changed_files": ["a.py"]},
        "cpu": {"kind": "AVX2 only", "model_name": "Some CPU", "torch_capability": "AVX2", "cores": 2},
        "workload": {
            **vs_trl.asdict(vs_trl.Workload(steps=2)),
            "precision_reason": "auto",
            "mean_prompt_tokens": 53.0,
            "prompts_sha256": "ab" * 32,
            "stop_ids": [2],
        },
        "sides": {"trl": trl, "privy_hf_lag0": privy},
        "ratios": {"privy_hf_lag0": trl_report.ratios(privy, trl)},
        "notes": trl_report.NOTES,
    }
    md = trl_report.markdown(report)
    assert "Some CPU, AVX2 only" in md and "--steps 2" in md and "uncommitted changes to 1" in md
    assert "| privy-rl, HF engine, lag 0 | 1.00 | 4.00 | 60.0 | 15.0 | 0.500 | 2.00x | **3.00x** |" in md


def test_rounds_pool_their_measured_steps_and_ratios_pair_within_each_round():
    """--repeats: each side runs once per round (interleaved); a side's rates pool every round's
    measured steps, and each ratio is taken within its round (the two runs next to each other in
    time), then averaged over rounds with its 95% t interval."""
    trl = [
        trl_report.summarize(_raw([9.0, 2.0, 2.0], [100, 40, 40])),
        trl_report.summarize(_raw([9.0, 4.0], [100, 40])),
    ]
    privy = [
        trl_report.summarize(_raw([9.0, 1.0, 1.0], [100, 40, 40])),
        trl_report.summarize(_raw([9.0, 1.0], [100, 40])),
    ]
    pooled = trl_report.pool(trl)
    assert pooled["rounds"] == 2 and pooled["measured_steps"] == 3
    assert pooled["completions_per_s"] == pytest.approx(12 / 8)
    assert pooled["response_tokens_per_s"] == pytest.approx(120 / 8)
    assert pooled["step_s_median"] == 2.0
    r = trl_report.round_ratios(privy, trl)
    assert r["per_completion_rounds"] == pytest.approx([2.0, 4.0]) and r["per_completion"] == pytest.approx(3.0)
    assert r["per_completion_low"] < 3.0 < r["per_completion_high"]
    assert trl_report.ratio_text(r, "per_completion").startswith("3.00x [")
    one = trl_report.round_ratios(privy[:1], trl[:1])
    assert one["per_response_token"] == pytest.approx(2.0) and one["per_response_token_low"] is None
    assert trl_report.ratio_text(one, "per_response_token") == "2.00x"
    with pytest.raises(ValueError, match="rounds"):
        trl_report.round_ratios(privy, trl[:1])


def test_trl_runs_the_same_adamw_kernel_as_the_learner():
    cfg = vs_trl.workload_config(vs_trl.Workload(model="tiny", steps=2, prompts=2))
    assert cfg.learner.fused_optimizer and vs_trl.trl_optim(cfg) == "adamw_torch_fused"
    loop = vs_trl.workload_config(vs_trl.Workload(model="tiny", steps=2, prompts=2, fused_optimizer=False))
    assert vs_trl.trl_optim(loop) == "adamw_torch"
