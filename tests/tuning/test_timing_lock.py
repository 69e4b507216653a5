"""The tuning trials' machine-wide timing lock and the other files tclang made under fixed
names in the temporary directory: another local user could hold such a lock (every trial
then timed out) or plant a symlink there (tclang created a file where it pointed). The lock
now lives in the private cache directory and is opened without following a symlink."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from tclang.tuning import trials

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """(cache directory, temporary directory), both fresh and empty; nothing said yet."""
    cache, temporary = tmp_path / "cache", tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(cache))
    monkeypatch.setattr("tempfile.tempdir", str(temporary))
    monkeypatch.setattr(trials, "_lock_warned", False, raising=False)
    return cache, temporary


def test_the_timing_lock_lives_in_the_private_cache_directory(dirs):
    cache, temporary = dirs
    with trials.machine_lock(exclusive=True):
        pass
    with trials.machine_lock(exclusive=False):
        pass
    lock = cache / "timing.lock"
    info = os.lstat(lock)
    assert stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()
    assert stat.S_IMODE(info.st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(cache).st_mode) & 0o077 == 0
    assert list(temporary.iterdir()) == []  # nothing in /tmp


def test_a_symlink_at_the_lock_path_is_never_followed(dirs, tmp_path):
    cache, temporary = dirs
    cache.mkdir(mode=0o700)
    targets = [tmp_path / "chosen-by-the-attacker", tmp_path / "chosen-too"]
    (cache / "timing.lock").symlink_to(targets[0])
    (temporary / f"tclang-timing-{os.getuid()}.lock").symlink_to(targets[1])  # the old name
    with pytest.warns(tc.TCWarning, match="timing lock .* cannot be used") as seen:
        with trials.machine_lock(exclusive=True):
            pass
        with trials.machine_lock(exclusive=False):
            pass
    assert not any(t.exists() or t.is_symlink() for t in targets)
    assert len([w for w in seen if "timing lock" in str(w.message)]) == 1  # once


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to give a file to another user")
def test_a_lock_file_of_another_user_is_refused(dirs):
    cache, _ = dirs
    cache.mkdir(mode=0o700)
    lock = cache / "timing.lock"
    lock.write_bytes(b"")
    os.chown(lock, 4242, 4242)
    with pytest.warns(tc.TCWarning, match="timing lock .*not a regular file of this user"):
        with trials.machine_lock(exclusive=True):
            pass


def test_a_refused_cache_directory_means_no_lock_and_one_warning(dirs):
    cache, temporary = dirs
    cache.mkdir()
    cache.chmod(0o777)
    with pytest.warns(tc.TCWarning, match="timing lock .*writable by group or others"):
        with trials.machine_lock(exclusive=True):
            pass
    assert list(cache.iterdir()) == [] and list(temporary.iterdir()) == []


def test_a_wrong_result_is_saved_in_the_private_cache_directory(dirs):
    from tclang.runtime.arguments import bind_arguments
    from tclang.tuning.space import SearchSpace
    cache, temporary = dirs
    source = "def add(float(N) A) -> (B) { B(i) = A(i) + 1 }"
    A = np.arange(4, dtype=np.float32)
    kernel = tc.define(source).add
    candidate = SearchSpace.of(kernel.definition, dict(bind_arguments(
        kernel.definition, (A,)).sizes), "cpu").automatic()
    task = trials.Task(source, "add", "cpu", (A,), (A,))
    where = Path(trials._save_reproducer(task, candidate, "output 0 differs"))
    assert where.parent == cache / "tuning-bugs" and where.exists()
    assert list(temporary.iterdir()) == []


def test_no_fixed_name_in_the_temporary_directory_remains():
    """A name in /tmp that another user can predict is one they can take first: only
    mkstemp/mkdtemp's random names are allowed there."""
    pattern = re.compile(r"gettempdir\(|[\"']/tmp\b|[\"']/var/tmp\b")
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
             for folder in ("tclang", "backends", "polyhedral")
             for path in sorted((ROOT / folder).rglob("*"))
             if path.suffix in (".py", ".h", ".c", ".cpp")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if pattern.search(line)]
    assert not found, "\n".join(found)
