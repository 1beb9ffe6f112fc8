"""Sweeps without Ray: point directory names, the manifest, point records, the summary tables."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from pipeline.core.config import ConfigError
from pipeline.tools import sweep
from pipeline.tools.cli import compose
from pipeline.tools.sweep_report import (
    Point,
    Settings,
    aggregate,
    groups_table,
    points_table,
    run_metrics,
    write_report,
)

ROOT = Path(__file__).resolve().parents[2]
KEYS = ["method.beta", "method.lam", "trainer.seed"]


# ----- names -------------------------------------------------------------------------------------


def test_a_point_is_named_after_its_job_and_swept_values_only():
    values = {"method.beta": "10", "method.lam": "0.01", "trainer.seed": "1"}
    assert sweep.point_dirname(3, values) == "3_beta=10_lam=0.01_seed=1"


@pytest.mark.parametrize(
    "value, safe",
    [
        ("[0.4,0.0]", "-0.4-0.0-"),
        ("/models/Qwen 3B", "-models-Qwen-3B"),
        ("-0.05", "-0.05"),  # a negative value keeps its sign
        ("a:b*c?", "a-b-c-"),
        ("1e-6", "1e-6"),
    ],
)
def test_values_are_sanitised(value, safe):
    assert sweep.sanitize(value) == safe


def test_a_long_name_is_cut_and_hashed_stably():
    values = {f"env.options.key_{i}": "/a/very/long/path/value" * 2 for i in range(6)}
    other = dict(values, **{"env.options.key_5": "something else"})
    name = sweep.point_dirname(7, values)
    assert len(name) <= sweep.MAX_NAME and name.startswith("7_key_0=")
    assert name == sweep.point_dirname(7, values)  # the same on a rerun
    assert name != sweep.point_dirname(7, other)
    assert all(c.isalnum() or c in "._=+-" for c in name)


def test_columns_are_last_key_components_unless_two_end_alike():
    from pipeline.tools.sweep_report import column_names

    assert column_names(["learner.lr", "scorer.lr", "method.beta", "method"]) == {
        "learner.lr": "learner.lr",
        "scorer.lr": "scorer.lr",
        "method.beta": "beta",
        "method": "method",
    }


def test_swept_keys_and_values_come_from_the_overrides():
    command = [
        "model=tiny",
        "method.beta=1,10",
        "trainer.seed=range(0,2)",
        "+x=choice(a,b)",
        "rollout.val_temperatures=[0.4,0.0]",
        'env.name="a,b"',
    ]
    assert sweep.swept_keys(command) == ["method.beta", "trainer.seed", "x"]
    job = ["model=tiny", "method.beta=10", "trainer.seed=1", "+x=b", "rollout.val_temperatures=[0.4,0.0]"]
    assert sweep.point_values(job, ["method.beta", "trainer.seed", "x"]) == {
        "method.beta": "10",
        "trainer.seed": "1",
        "x": "b",
    }


def test_the_configured_subdir_names_a_point_from_the_manifest(tmp_path):
    """conf/config.yaml's own hydra.sweep.subdir, resolved as Hydra does for a job."""
    subdir = yaml.safe_load((ROOT / "conf" / "config.yaml").read_text())["hydra"]["sweep"]["subdir"]
    fixed = [
        "model=tiny",
        "env=keyword",
        "method=sdar",
        "trainer.total_steps=2",
        "rollout.max_new_tokens=8",
        "learner.precision=fp32",
        "rollout.precision=fp32",
        "logger.progress=false",
        "trainer.val_every=1",
        "trainer.val_tasks=1",
        "trainer.ckpt_every=0",
        "rollout.group_size=2",
        "trainer.groups_per_step=1",
    ]
    sweep.check_manifest(tmp_path, [*fixed, "method.beta=1,10", "method.lam=0.01,0.1", "trainer.seed=0,1"])
    job = [*fixed, "method.beta=10", "method.lam=0.01", "trainer.seed=1"]
    cfg = OmegaConf.create(
        {"hydra": {"sweep": {"dir": str(tmp_path), "subdir": subdir}, "job": {"num": 5}, "overrides": {"task": job}}}
    )
    assert cfg.hydra.sweep.subdir == "5_beta=10_lam=0.01_seed=1"


# ----- the manifest ------------------------------------------------------------------------------


def test_a_rerun_must_repeat_the_command_but_may_change_the_cluster(tmp_path):
    command = ["model=tiny", "method.beta=1,10", "trainer.seed=0,1"]
    assert sweep.check_manifest(tmp_path, command) == ["method.beta", "trainer.seed"]
    assert sweep.check_manifest(tmp_path, command) == ["method.beta", "trainer.seed"]
    sweep.check_manifest(tmp_path, ["cluster=existing", "cluster.address=auto", *command])
    with pytest.raises(ValueError, match=r"hydra.sweep.dir=.*learner.lr=1e-5.*sweep.name"):
        sweep.check_manifest(tmp_path, [*command, "learner.lr=1e-5"])
    with pytest.raises(ValueError, match="another order"):
        sweep.check_manifest(tmp_path, ["model=tiny", "trainer.seed=0,1", "method.beta=1,10"])


# ----- point records -----------------------------------------------------------------------------


def test_a_point_record_keeps_status_error_and_seconds_over_attempts(tmp_path, monkeypatch):
    clock = iter([100.0, 103.0, 200.0, 202.5])
    monkeypatch.setattr(sweep.time, "time", lambda: next(clock))
    rec = sweep.PointRecord(tmp_path)
    assert not rec.finished() and not rec.resumable()
    rec.start()
    rec.end("failed", "RuntimeError: boom")
    again = sweep.PointRecord(tmp_path)
    assert again.status == "failed" and again.state["error"] == "RuntimeError: boom"
    again.start()
    again.end("done")
    final = sweep.PointRecord(tmp_path)
    assert final.finished() and final.state["attempts"] == 2 and final.state["error"] == ""
    assert final.state["seconds"] == pytest.approx(5.5)


def test_a_point_with_a_checkpoint_or_a_first_phase_is_resumable(tmp_path):
    ckpt = tmp_path / "a" / "checkpoints"
    (ckpt / "step_000002").mkdir(parents=True)
    (ckpt / "latest").write_text("step_000002")
    assert not sweep.PointRecord(tmp_path / "a").resumable()  # no controller.pt: incomplete
    (ckpt / "step_000002" / "controller.pt").write_bytes(b"")
    assert sweep.PointRecord(tmp_path / "a").resumable()
    (tmp_path / "b" / "phase1_teacher").mkdir(parents=True)  # RetireOPD's teacher phase
    assert sweep.PointRecord(tmp_path / "b").resumable()


# ----- a run's numbers ---------------------------------------------------------------------------


def test_run_metrics_take_final_and_best_values_and_diagnostics():
    rows = [
        {"step": 1, "rollout/reward": 0.1, "rollout/success": 0.0, "sdar/gate_mean": 0.4},
        {
            "step": 2,
            "rollout/reward": 0.3,
            "rollout/success": 0.5,
            "val/success": 0.75,
            "val/privilege_gap": 0.25,
            "sdar/gate_mean": 0.6,
        },
        {"step": 3, "rollout/reward": 0.2, "rollout/success": 0.5, "sdar/gate_mean": None},
        {"step": 4, "rollout/reward": 0.4, "rollout/success": 1.0, "val/success": 0.5},
    ]
    m = run_metrics(rows, "val/success")
    assert m == {
        "val/success": 0.5,
        "best val/success": 0.75,
        "rollout/reward": 0.4,
        "rollout/success": 1.0,
        "steps": 4,
        "gate_mean": 0.6,
        "privilege_gap": 0.25,
    }
    assert "retire_step" not in m and "shaping_abs_mean" not in m  # not logged: left blank


def test_a_resumed_run_s_repeated_steps_count_once(tmp_path):
    from pipeline.tools.sweep_report import read_rows

    lines = [
        {"step": 1, "rollout/reward": 0.1},
        {"step": 2, "rollout/reward": 0.2},
        {"step": 2, "rollout/reward": 0.5},
        {"step": 3, "rollout/reward": 0.6},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert [(r["step"], r["rollout/reward"]) for r in read_rows(tmp_path)] == [(1, 0.1), (2, 0.5), (3, 0.6)]


# ----- tables ------------------------------------------------------------------------------------


def _grid(failed: str | None = None) -> list[Point]:
    """2 x 2 x 2 points; val/success = beta/10 + lam + seed/100, so (10, 0.1) is best."""
    points, num = [], 0
    for beta in ("1", "10"):
        for lam in ("0.01", "0.1"):
            for seed in ("0", "1"):
                name = f"{num}_beta={beta}_lam={lam}_seed={seed}"
                values = dict(zip(KEYS, (beta, lam, seed)))
                overrides = ["model=tiny", f"method.beta={beta}", f"method.lam={lam}", f"trainer.seed={seed}"]
                if name == failed:
                    points.append(Point(name, values, "failed", overrides, "RuntimeError: out of memory"))
                else:
                    v = float(beta) / 10 + float(lam) + float(seed) / 100
                    points.append(
                        Point(
                            name,
                            values,
                            "done",
                            overrides,
                            metrics={"val/success": v, "rollout/reward": 2 * v, "steps": 2, "wall_s": 10.0},
                        )
                    )
                num += 1
    return points


def test_the_points_table_has_a_column_per_swept_key_and_a_row_per_failed_point():
    rows = points_table(_grid(failed="5_beta=10_lam=0.01_seed=1"), KEYS, Settings())
    assert len(rows) == 8
    assert list(rows[0])[:7] == ["best", "job", "beta", "lam", "seed", "status", "val/success"]
    failed = rows[5]
    assert failed["status"] == "failed" and failed["error"] == "RuntimeError: out of memory"
    assert failed["val/success"] == "" and failed["beta"] == "10"
    assert [r["job"] for r in rows if r["best"]] == ["7_beta=10_lam=0.1_seed=1"]
    assert "gate_mean" not in rows[0]  # no point logged it


def test_aggregating_over_seeds_gives_mean_std_and_n_best_first():
    points = _grid(failed="5_beta=10_lam=0.01_seed=1")
    groups = aggregate(points, KEYS, ["trainer.seed"])
    assert len(groups) == 4 and all(len(g.points) == 2 for g in groups)
    rows = groups_table(groups, KEYS, Settings(), points)
    assert [(r["beta"], r["lam"]) for r in rows] == [("10", "0.1"), ("10", "0.01"), ("1", "0.1"), ("1", "0.01")]
    assert rows[0]["best"] == "*" and not any(r["best"] for r in rows[1:])
    assert rows[0]["n"] == "2" and rows[0]["val/success"] == "1.105 ± 0.0071"
    assert (rows[1]["n"], rows[1]["failed"], rows[1]["val/success"]) == ("1", "1", "1.01")
    low_first = groups_table(groups, KEYS, Settings(goal="min"), points)
    assert (low_first[0]["beta"], low_first[0]["lam"]) == ("1", "0.01")


def test_a_group_whose_points_all_failed_sorts_last_with_n_0():
    points = _grid()
    for p in points:
        if p.values["method.beta"] == "10" and p.values["method.lam"] == "0.1":
            p.status, p.metrics, p.error = "failed", {}, "ValueError: bad"
    rows = groups_table(aggregate(points, KEYS, ["trainer.seed"]), KEYS, Settings(), points)
    assert (rows[-1]["beta"], rows[-1]["lam"], rows[-1]["n"], rows[-1]["val/success"]) == ("10", "0.1", "0", "")


def test_the_report_writes_both_tables_the_csvs_and_the_plot(tmp_path):
    points = _grid(failed="2_beta=1_lam=0.1_seed=0")
    common = ["model=tiny"]
    sweeps = ["method.beta=1,10", "method.lam=0.01,0.1", "trainer.seed=0,1"]
    report = write_report(tmp_path, points, KEYS, Settings(), common, sweeps)
    assert (report.points, report.failed) == (8, 1)
    md = report.markdown.read_text()
    assert "## Over trainer.seed" in md and "| best | beta | lam | n | failed | val/success" in md
    assert "| best | job | beta | lam | seed | status |" in md
    assert "RuntimeError: out of memory" in md
    assert "`method.beta=10 method.lam=0.1 trainer.seed=1`" in md  # each point's swept values, whole keys
    with open(tmp_path / "sweep_summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 8 and rows[0]["overrides"] == "model=tiny method.beta=1 method.lam=0.01 trainer.seed=0"
    with open(tmp_path / "sweep_summary_aggregate.csv") as f:
        agg = list(csv.DictReader(f))
    assert len(agg) == 4 and {"val/success mean", "val/success std", "n"} <= set(agg[0])
    assert report.plot == tmp_path / "sweep_summary.png" and report.plot.stat().st_size > 1000


def test_without_a_swept_seed_there_is_no_aggregate_table(tmp_path):
    points = [p for p in _grid() if p.values["trainer.seed"] == "0"]
    for p in points:
        del p.values["trainer.seed"]
    report = write_report(tmp_path, points, KEYS[:2], Settings())
    assert "mean ± std" not in report.markdown.read_text()
    assert not (tmp_path / "sweep_summary_aggregate.csv").exists()
    assert report.plot is not None


def test_no_plot_when_no_point_has_the_primary_metric(tmp_path):
    report = write_report(tmp_path, _grid(), KEYS, Settings(metric="val/not_logged"))
    assert report.plot is None and not (tmp_path / "sweep_summary.png").exists()


# ----- run dirs that were not one multirun -------------------------------------------------------


def test_run_dirs_of_separate_jobs_are_summarised_by_their_differing_config(tmp_path):
    for beta in (1, 10):
        d = tmp_path / f"beta{beta}"
        d.mkdir()
        cfg = {"method": {"name": "sdar", "beta": beta}, "trainer": {"run_dir": str(d), "seed": 0}}
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
        (d / "metrics.jsonl").write_text(json.dumps({"step": 1, "val/success": beta / 10}) + "\n")
    (tmp_path / "beta1" / "summary.json").write_text(json.dumps({"steps": 1, "seconds": 3.0}))
    keys, points = sweep.collect_runs(tmp_path, "val/success")
    assert keys == ["method.beta"]
    assert [(p.name, p.values, p.status) for p in points] == [
        ("beta1", {"method.beta": "1"}, "done"),
        ("beta10", {"method.beta": "10"}, "unfinished"),
    ]


# ----- config ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, field",
    [
        ("sweep.goal=up", "sweep.goal"),
        ("sweep.metric=", "sweep.metric"),
        ("sweep.name=/abs/x", "sweep.name"),
    ],
)
def test_a_bad_sweep_setting_fails_naming_the_field(override, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        compose([override])


def test_the_default_sweep_dir_is_a_timestamp_and_sweep_name_replaces_it():
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from pipeline.core.config import register_schema
    from pipeline.tools.cli import CONF_DIR

    register_schema()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        named = hydra_compose("config", overrides=["sweep.name=sdar_grid"], return_hydra_config=True)
        default = hydra_compose("config", return_hydra_config=True)
    assert named.hydra.sweep.dir == "multirun/sdar_grid"
    assert default.hydra.sweep.dir.startswith("multirun/2") and default.hydra.sweep.dir.count("/") == 2
