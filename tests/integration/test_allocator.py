"""``cluster.allocator``: the actors of a run get their malloc from the environment they start in
(``pipeline.core.runtime_env.allocator_env``, passed as Ray runtime env vars): with ``jemalloc``
the process really has Ray's bundled jemalloc mapped, and frees a step's memory back; with
``system`` it has glibc's alone. Real Ray actors on the local node."""

from __future__ import annotations

import pytest

from pipeline.core.runtime_env import allocator_env

pytestmark = pytest.mark.integration


def test_the_actors_run_on_the_jemalloc_ray_ships_unless_told_otherwise(ray_local):
    class Probe:
        def maps(self) -> str:
            with open("/proc/self/maps") as f:
                return f.read()

        def private_after_churn(self) -> tuple[float, float]:
            """Private resident GB before and after allocating and freeing ~1.5 GB in tensors of
            many sizes (a step's activations, in small)."""
            import torch

            from actors.learner_memory import status_gb

            before = status_gb("RssAnon")
            kept = []
            for i in range(300):
                kept.append(torch.ones(1000 + 37 * i, 1000 // (1 + i % 7)))
                if i % 3 == 0:
                    kept.pop(0)
            del kept
            return before, status_gb("RssAnon")

    env = allocator_env("jemalloc")
    assert env["LD_PRELOAD"].endswith("ray/core/libjemalloc.so")
    probe = ray_local.remote(Probe)
    on = probe.options(runtime_env={"env_vars": env}).remote()
    off = probe.options(runtime_env={"env_vars": allocator_env("system")}).remote()
    assert "libjemalloc" in ray_local.get(on.maps.remote())
    assert "libjemalloc" not in ray_local.get(off.maps.remote())
    before, after = ray_local.get(on.private_after_churn.remote())
    kept_on = after - before
    before, after = ray_local.get(off.private_after_churn.remote())
    kept_off = after - before
    # what was freed went back with jemalloc (0.07 GB kept here), glibc kept it (1.05 GB)
    assert kept_on < 0.3 and kept_off > kept_on + 0.5, (kept_on, kept_off)
    for actor in (on, off):
        ray_local.kill(actor)


def test_a_bad_allocator_fails_at_launch_naming_the_field():
    from pipeline.core.config import ConfigError
    from pipeline.tools.cli import compose

    with pytest.raises(ConfigError, match=r"cluster\.allocator='tcmalloc': jemalloc \| system"):
        compose(["cluster.allocator=tcmalloc"])


def test_what_the_user_preloads_stays_preloaded(monkeypatch):
    lib = allocator_env("jemalloc")["LD_PRELOAD"]
    monkeypatch.setenv("LD_PRELOAD", "/opt/mine.so")
    assert allocator_env("jemalloc") == {"LD_PRELOAD": f"{lib}:/opt/mine.so"}
    monkeypatch.setenv("LD_PRELOAD", f"/opt/mine.so:{lib}")  # already there: left as it is
    assert allocator_env("jemalloc") == {"LD_PRELOAD": f"/opt/mine.so:{lib}"}
    assert allocator_env("system") == {}
