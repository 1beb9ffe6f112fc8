"""The report of ``scripts/bench/vs_trl.py``: each side's rates over its measured steps, the
rounds pooled, the privy-rl / TRL ratios (paired within a round, their mean with a 95% t interval),
the markdown and the stored table, and where it ran (CPU kind, commit)."""

from __future__ import annotations

import os
import statistics
import subprocess
from pathlib import Path

from lab.checkout import ROOT


def summarize(raw: dict) -> dict:
    """Rates over the measured steps (all after the first, unless there is only one)."""
    k = 1 if len(raw["step_s"]) > 1 else 0
    sec = raw["step_s"][k:]
    done, tokens = sum(raw["completions"][k:]), sum(raw["response_tokens"][k:])
    out = {
        "measured_steps": len(sec),
        "step_s_median": statistics.median(sec),
        "measured_step_s": sec,
        "measured_s": sum(sec),
        "completions": done,
        "response_tokens": round(tokens),
        "completions_per_s": done / sum(sec),
        "response_tokens_per_s": tokens / sum(sec),
        "mean_completion_tokens": tokens / done,
        "mean_completion_tokens_per_step": [t / c for t, c in zip(raw["response_tokens"], raw["completions"])],
    }
    for key in ("generate_s", "wait_rollout_s", "train_s", "sync_s"):
        if key in raw:
            out[key + "_median"] = statistics.median(raw[key][k:])
    return out | {key: raw[key] for key in raw if key not in ("completions", "response_tokens")}


def pool(rounds: list[dict]) -> dict:
    """One side over its rounds (``summarize`` of each): rates over every round's measured steps."""
    first = rounds[0]
    for s in rounds[1:]:
        if s["prompts_sha256"] != first["prompts_sha256"] or s["stop_ids"] != first["stop_ids"]:
            raise SystemExit("two rounds of one side got different prompts or stop ids")
    sec = sum(s["measured_s"] for s in rounds)
    done, tokens = sum(s["completions"] for s in rounds), sum(s["response_tokens"] for s in rounds)
    out = {
        "rounds": len(rounds),
        "measured_steps": sum(s["measured_steps"] for s in rounds),
        "step_s_median": statistics.median(x for s in rounds for x in s["measured_step_s"]),
        "measured_s": sec,
        "completions": done,
        "response_tokens": tokens,
        "completions_per_s": done / sec,
        "response_tokens_per_s": tokens / sec,
        "mean_completion_tokens": tokens / done,
        "reward_mean": statistics.fmean(s["reward_mean"] for s in rounds if s["reward_mean"] is not None),
        "prompts_sha256": first["prompts_sha256"],
        "stop_ids": first["stop_ids"],
    }
    for key in ("generate_s_median", "wait_rollout_s_median", "train_s_median", "sync_s_median"):
        if key in first:
            out[key] = statistics.median(s[key] for s in rounds)
    return out


def round_ratios(side: list[dict], trl: list[dict]) -> dict:
    """privy-rl / TRL within each round (the two runs nearest in time), then their mean over the
    rounds with its 95% t interval (``_low``/``_high``: None with one round) and the rounds' values."""
    from lab.stats import mean_interval

    if len(side) != len(trl):
        raise ValueError(f"{len(side)} and {len(trl)} rounds: one ratio per round needs both sides in each")
    out = {}
    for key in ("per_completion", "per_response_token"):
        values = [ratios(s, t)[key] for s, t in zip(side, trl)]
        ci = mean_interval(values)
        out |= {key: ci.mean, f"{key}_low": ci.low, f"{key}_high": ci.high, f"{key}_rounds": values}
    return out


def ratios(side: dict, trl: dict) -> dict:
    return {
        "per_completion": side["completions_per_s"] / trl["completions_per_s"],
        "per_response_token": side["response_tokens_per_s"] / trl["response_tokens_per_s"],
    }


def cpu_kind() -> dict:
    from pipeline.core.hardware import CpuFeatures

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    name = ""
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
        name = next((line.split(":", 1)[1].strip() for line in lscpu.splitlines() if line.startswith("Model name")), "")
    except (OSError, subprocess.SubprocessError):
        pass
    cpu = CpuFeatures.detect()
    return {
        "kind": "avx512_bf16" if "avx512_bf16" in info else "AVX2 only",
        "model_name": name,
        "cores": os.cpu_count(),
        "torch_capability": cpu.capability,
        "amx": cpu.amx_bf16,
        "native_bf16": cpu.native_bf16,
    }


def git_state() -> dict:
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], capture_output=True, text=True, cwd=ROOT).stdout.strip()

    changed = git("diff", "--name-only", "HEAD").splitlines()  # tracked files differing from the commit
    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed), "changed_files": changed}


def side_label(name: str) -> str:
    if name == "trl":
        return "TRL GRPOTrainer"
    engine, lag = name.split("_")[1], name.split("lag")[1]
    return f"privy-rl, {'HF' if engine == 'hf' else 'vLLM'} engine, lag {lag}"


def markdown(r: dict) -> str:
    w, cpu, g = r["workload"], r["cpu"], r["git"]
    lines = [
        "# privy-rl vs TRL GRPOTrainer (`scripts/bench/vs_trl.py`)",
        "",
        f"- Run: {r['date']}, git {g['commit'][:12]}"
        + (
            f" with uncommitted changes to {len(g['changed_files'])} tracked files (listed in results.json)"
            if g["dirty"]
            else ""
        ),
        f"- CPU: {cpu['model_name'] or 'unknown'}, {cpu['kind']} (torch capability {cpu['torch_capability']}, "
        f"{cpu['cores']} cores)",
        f"- Command: `{r['command']}`",
        f"- Workload, identical on both sides: {w['model']}; {w['prompts']} prompts x {w['generations']} completions "
        f"per step, at most {w['new_tokens']} new tokens, temperature {w['temperature']:g}, top-p 1; {w['precision']} "
        f"({w['precision_reason']}); GRPO, no reference model, no entropy bonus, "
        f"{'fused ' if w.get('fused_optimizer', False) else ''}AdamW lr {w['lr']:g} constant; "
        f"{w['steps']} steps, the first not counted"
        + (
            f"; {r['repeats']} rounds, interleaved (ratios: mean over rounds [95% t interval])."
            if r.get("repeats", 1) > 1
            else "."
        ),
        f"- Prompts: the first {w['prompts'] * w['steps']} tasks of privy-rl's keyword training stream, "
        f"{w['mean_prompt_tokens']:.1f} tokens on average with the chat template; the ids TRL fed to generate "
        f"were checked equal to privy-rl's (sha256 {w['prompts_sha256'][:16]}...). Stop ids {w['stop_ids']}.",
        "",
        "| | s / step (median) | completions / s | response tokens / s | mean completion (tokens) "
        "| mean reward | vs TRL per completion | vs TRL per response token |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in r["sides"].items():
        rat = r["ratios"].get(name, {"per_completion": 1.0, "per_response_token": 1.0})
        lines.append(
            f"| {side_label(name)} | {s['step_s_median']:.2f} | {s['completions_per_s']:.2f} | "
            f"{s['response_tokens_per_s']:.1f} | {s['mean_completion_tokens']:.1f} | {s['reward_mean']:.3f} | "
            f"{ratio_text(rat, 'per_completion')} | **{ratio_text(rat, 'per_response_token')}** |"
        )
    lines += ["", *("- " + n for n in r["notes"]), ""]
    return "\n".join(lines)


NOTES = [
    "Rates: the completions (or the tokens they sampled) of the measured steps over those steps' total seconds. "
    "A completion's tokens are the ids it sampled up to and including its first stop id (all of them if none "
    "came), counted the same way on both sides.",
    "The per-response-token ratio is the fair one: completion lengths follow each side's own samples, so "
    "per completion the side that happened to sample longer completions looks slower. privy-rl's engines have "
    "no forced-length (min_new_tokens) mode, so no run with equal lengths is offered.",
    "TRL's bf16 is autocast over fp32 weights (bf16=True, use_cpu=True); privy-rl's is bf16 weights in engine and "
    "learner with fp32 master weights.",
    "At lag 1 privy-rl trains on completions sampled up to one step earlier while the next ones are sampled: "
    "the same work per step, but not TRL's on-policy algorithm.",
]


def ratio_text(rat: dict, key: str) -> str:
    """``1.31x`` or, over several rounds, ``1.31x [1.20, 1.42]``."""
    low, high = rat.get(f"{key}_low"), rat.get(f"{key}_high")
    return f"{rat[key]:.2f}x" + (f" [{low:.2f}, {high:.2f}]" if low is not None else "")


def table_rows(r: dict) -> list[dict]:
    """The side-by-side table as rows of strings (``lab.results.render_md`` renders it)."""
    rows = []
    for name, s in r["sides"].items():
        rat = r["ratios"].get(name, {"per_completion": 1.0, "per_response_token": 1.0})
        rows.append(
            {
                "side": side_label(name),
                "s / step (median)": f"{s['step_s_median']:.2f}",
                "completions / s": f"{s['completions_per_s']:.2f}",
                "response tokens / s": f"{s['response_tokens_per_s']:.1f}",
                "mean completion (tokens)": f"{s['mean_completion_tokens']:.1f}",
                "mean reward": f"{s['reward_mean']:.3f}",
                "vs TRL per completion": ratio_text(rat, "per_completion"),
                "vs TRL per response token": ratio_text(rat, "per_response_token"),
            }
        )
    return rows
