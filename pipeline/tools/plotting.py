"""Curves of a run (metrics.jsonl) drawn to PNG: reward, success, validation, valid actions,
entropy, clip fraction, KL, grad norm, timings, and every method metric that was logged."""

from __future__ import annotations

import json
from pathlib import Path

PANELS = [
    ("reward", ["rollout/reward", "rollout/row_score"]),
    ("success", ["rollout/success", "val/success", "val/privileged_success"]),
    ("valid actions", ["rollout/valid_action_rate"]),
    ("entropy", ["policy/entropy"]),
    ("clipping", ["policy/clip_fraction", "policy/dual_clip_fraction"]),
    ("approx KL", ["policy/approx_kl_k1", "policy/approx_kl_k3"]),
    ("grad norm", ["learner/grad_norm"]),
    ("seconds per step", ["time/step_s", "time/train_s", "time/wait_rollout_s"]),
]
METHOD_PREFIXES = ("sdar/", "opd/", "adrs/", "tg/", "sd/", "gigpo/", "skill_sd/")


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    keys = {k for r in rows for k in r}
    panels = [(t, [k for k in ks if k in keys]) for t, ks in PANELS]
    extra = sorted(k for k in keys if k.startswith(METHOD_PREFIXES))
    panels += [(k, [k]) for k in extra[:8]]
    panels = [(t, ks) for t, ks in panels if ks]
    cols = 3
    nrows = max(1, -(-len(panels) // cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.2 * nrows), squeeze=False)
    for ax, (title, ks) in zip(axes.flat, panels):
        for k in ks:
            pts = [(r["step"], r[k]) for r in rows if r.get(k) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="." if len(pts) < 40 else None, label=k)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    out = Path(out) if out else Path(run_dir) / "curves.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def try_plot(run_dir: str | Path) -> Path | None:
    """Plot if there is anything to plot; a plotting failure never fails a finished run."""
    try:
        return plot_run(run_dir)
    except Exception as e:  # report and go on
        print(f"privy-rl: plotting skipped: {e}")
        return None
