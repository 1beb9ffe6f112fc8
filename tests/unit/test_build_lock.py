"""A lock of torch's extension build left by a killed process must not hang every later learner:
``clear_stale_build_lock`` removes one older than any build, and leaves a fresh one (a build in
progress) alone."""

from __future__ import annotations

import os

from actors.learner_setup import STALE_LOCK_S, clear_stale_build_lock


def test_a_lock_older_than_any_build_is_removed(tmp_path, capsys):
    lock = tmp_path / "lock"
    lock.touch()
    old = lock.stat().st_mtime - STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    assert clear_stale_build_lock(tmp_path) is True
    assert not lock.exists() and "never finished" in capsys.readouterr().out


def test_a_fresh_lock_or_none_is_left_alone(tmp_path):
    assert clear_stale_build_lock(tmp_path) is False  # no lock
    lock = tmp_path / "lock"
    lock.touch()
    assert clear_stale_build_lock(tmp_path) is False and lock.exists()
    assert clear_stale_build_lock(tmp_path, now=lock.stat().st_mtime + STALE_LOCK_S + 1) is True
