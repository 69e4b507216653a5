"""The disk cache trusts nothing it reads (an entry is object code that is linked and run).

Each test has its own cache directory and its own key file (outside it). Whoever can write
the directory must not be able to run code as the user: a directory others can write is
refused, files owned by others are ignored, every entry is authenticated with the user's
key before it is parsed, and an authenticated entry that is still unusable (object code
for no machine, a malformed header, a kernel summary that disagrees with the key) is
discarded and rebuilt, never a crash. The directory is kept under a size cap, least
recently used entries first, and temporary files of killed writers are swept.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import tclang as tc
from tclang.driver import compiler, diskcache
from tclang.driver.cachekey import key_digest

ROOT = Path(__file__).resolve().parents[2]
ADD = "def f(float(N) A) -> (B) {{ B(i) = A(i) + {} }}"
X = np.arange(6, dtype=np.float32)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(directory))
    monkeypatch.setenv("TCLANG_CACHE_KEY_FILE", str(tmp_path / "config" / "cache.key"))
    monkeypatch.delenv("TCLANG_CACHE_MAX_BYTES", raising=False)
    monkeypatch.setenv("TCLANG_CALL_RECORDS", "0")  # the kernel entries alone (see below)
    compiler.forget_compiled()
    monkeypatch.setattr(diskcache, "_warned", set(), raising=False)
    return directory


def run_add(step: int = 1) -> np.ndarray:
    """A fresh process's view: nothing in memory, so the disk cache is asked."""
    compiler.forget_compiled()
    result = tc.define(ADD.format(step)).f(X)
    np.testing.assert_array_equal(result, X + step)
    return result


@contextlib.contextmanager
def warnings_recorded():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.tck"))


def only_key() -> tuple:
    (key,) = compiler._memory
    return key


def test_a_directory_others_can_write_is_refused(cache):
    cache.mkdir(mode=0o700)
    cache.chmod(0o770)
    with pytest.warns(tc.TCWarning, match="writable by group or others.*chmod 700"):
        run_add(1)
    assert entries(cache) == []
    with warnings_recorded() as caught:  # said once per process, not at every compile
        run_add(2)
    assert caught == []


def test_an_entry_owned_by_another_user_is_ignored(cache):
    run_add()
    (entry,) = entries(cache)
    try:
        os.chown(entry, 54321, 54321)
    except PermissionError:
        pytest.skip("only root can give a file away")
    with pytest.warns(tc.TCWarning, match="owned by another user"):
        run_add()
    assert entry.stat().st_uid == os.getuid()  # rebuilt by this user


def test_an_entry_copied_over_another_kernels_file_does_not_authenticate(cache):
    run_add(1)
    (plus_one,) = entries(cache)
    run_add(2)
    (plus_two,) = [p for p in entries(cache) if p != plus_one]
    plus_two.write_bytes(plus_one.read_bytes())
    with pytest.warns(tc.TCWarning, match="not authenticated"):
        run_add(2)


def test_an_entry_signed_with_another_key_is_rejected(cache, tmp_path, monkeypatch):
    run_add()
    monkeypatch.setenv("TCLANG_CACHE_KEY_FILE", str(tmp_path / "other" / "cache.key"))
    with pytest.warns(tc.TCWarning, match="not authenticated"):
        run_add()
    with warnings_recorded() as caught:  # rebuilt under the new key
        run_add()
    assert caught == []


BAD_OBJECT = r'''
import sys, warnings
import numpy as np, tclang as tc
from tclang.driver import compiler, diskcache
from tclang.driver.cachekey import key_digest
SOURCE = "def f(float(N) A) -> (B) { B(i) = A(i) + 1 }"
x = np.arange(6, dtype=np.float32)
tc.define(SOURCE).f(x)
(key,) = compiler._memory
blobs = diskcache.load(key_digest(key), key)
code = blobs["object"]
blobs["object"] = {
    "garbage": b"\x7fELF" + bytes(range(256)) * 8,
    "truncated": code[:200],
    "other-machine": code[:18] + b"\x28\x00" + code[20:],  # ARM
}[sys.argv[1]]
diskcache.store(key_digest(key), key, blobs)  # signed with this user's key
compiler.forget_compiled()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert (tc.define(SOURCE).f(x) == x + 1).all()
print("|".join(str(w.message) for w in caught))
'''


@pytest.mark.parametrize("damage", ["garbage", "truncated", "other-machine"])
def test_an_authenticated_object_for_no_machine_is_rebuilt_not_linked(cache, damage):
    """In a child: handed to LLVM, such an object can kill the process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TCLANG_VERIFY", None)
    done = subprocess.run([sys.executable, "-c", BAD_OBJECT, damage], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "discarding an unusable compile cache entry" in done.stdout, done.stdout
    assert "object code" in done.stdout, done.stdout


@pytest.mark.parametrize("header", [[1, 2], {"blobs": 5}, "text", {"blobs": [[0, 1]]},
                                    {"blobs": {"object": [0, -1]}}])
def test_an_authenticated_header_of_the_wrong_shape_is_rebuilt(cache, header):
    run_add()
    key = only_key()
    if isinstance(header, dict):
        header = dict(header, key=repr(key))
    digest = key_digest(key)
    head = json.dumps(header).encode()
    body = len(head).to_bytes(8, "little") + head
    secret = diskcache.secret_key(cache)
    (cache / f"{digest}.tck").write_bytes(
        diskcache.MAGIC + diskcache._tag(secret, digest, body) + body)
    with pytest.warns(tc.TCWarning, match="malformed header"):
        run_add()


@pytest.mark.parametrize("change", ["name", "shape", "dtype", "rank"])
def test_a_kernel_summary_that_disagrees_with_its_key_is_rebuilt(cache, change):
    tc.define(ADD.format(1)).f(X)
    key = only_key()
    blobs = diskcache.load(key_digest(key), key)
    info = json.loads(blobs["info"])
    source = info["buffers"][0]
    if change == "name":
        info["name"] = "g"
    elif change == "shape":
        source[2] = [1 << 20]  # sizes in the summary decide what a call allocates
    elif change == "dtype":
        source[1] = "float64"
    else:
        source[2] = [6, 1]
    blobs["info"] = json.dumps(info).encode()
    diskcache.store(key_digest(key), key, blobs)
    with pytest.warns(tc.TCWarning, match="unusable compile cache entry"):
        run_add(1)


def test_the_least_recently_used_entries_are_evicted_over_the_cap(cache, monkeypatch):
    run_add(1)
    run_add(2)
    first, second = sorted(entries(cache), key=lambda p: p.stat().st_mtime)
    old = time.time() - 1000
    os.utime(first, (old, old))
    os.utime(second, (old + 10, old + 10))
    run_add(1)  # a hit: the first entry is now the most recently used
    assert first.stat().st_mtime > old + 10
    size = max(first.stat().st_size, second.stat().st_size)
    monkeypatch.setenv("TCLANG_CACHE_MAX_BYTES", str(2 * size + size // 2))
    run_add(3)  # a third entry: one must go, the least recently used
    left = entries(cache)
    assert first in left and second not in left and len(left) == 2


def test_a_bad_cap_is_refused(cache, monkeypatch):
    """It only warned, and kept the default (tclang/environment.py: every TCLANG_* number is
    checked alike)."""
    monkeypatch.setenv("TCLANG_CACHE_MAX_BYTES", "lots")
    with pytest.raises(tc.TCConfigError, match="TCLANG_CACHE_MAX_BYTES must be a whole "
                                               "number of at least 1, not 'lots'"):
        run_add()
    assert not entries(cache)


def test_temporary_files_of_killed_writers_are_swept(cache):
    run_add(1)
    stale, fresh = cache / ".dead.writer.tmp", cache / ".busy.writer.tmp"
    for path in (stale, fresh):
        path.write_bytes(b"half an entry")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    run_add(2)  # a store: sweeps
    assert not stale.exists() and fresh.exists()


def test_the_key_file_is_created_private_outside_the_cache(cache, tmp_path):
    key_file = tmp_path / "config" / "cache.key"
    run_add()
    assert key_file.exists() and not key_file.is_relative_to(cache)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    assert len(key_file.read_bytes()) == 32
    assert [p.name for p in key_file.parent.iterdir()] == ["cache.key"]  # no temp left


def test_a_key_file_others_can_read_is_refused(cache, tmp_path):
    run_add()
    key_file = tmp_path / "config" / "cache.key"
    key_file.chmod(0o644)
    compiler.forget_compiled()
    with pytest.warns(tc.TCWarning, match="key file .* not private.*TCLANG_CACHE_KEY_FILE"):
        run_add()


def test_a_key_file_inside_the_cache_is_refused(cache, monkeypatch):
    monkeypatch.setenv("TCLANG_CACHE_KEY_FILE", str(cache / "cache.key"))
    with pytest.warns(tc.TCWarning, match="inside the cache directory"):
        run_add()
    assert not (cache / "cache.key").exists() and entries(cache) == []


def test_parents_are_created_private(tmp_path, monkeypatch, cache):
    nested = tmp_path / "made" / "by" / "tclang"
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(nested))
    run_add()
    for path in (nested, nested.parent, nested.parent.parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path



RACE = r'''
import sys
from pathlib import Path
from tclang.driver import diskcache
print(diskcache.secret_key(Path(sys.argv[1])).hex())
'''


def test_racing_processes_agree_on_one_key(cache, tmp_path):
    """Each creates its key aside and links it into place: the first wins, the others
    read its key, and none reads a half-written one."""
    cache.mkdir(mode=0o700)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    children = [subprocess.Popen([sys.executable, "-c", RACE, str(cache)], env=env, cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(6)]
    keys = []
    for child in children:
        out, err = child.communicate(timeout=120)
        assert child.returncode == 0, err[-2000:]
        keys.append(out.strip())
    key_file = tmp_path / "config" / "cache.key"
    assert set(keys) == {key_file.read_bytes().hex()}
    assert [p.name for p in key_file.parent.iterdir()] == ["cache.key"]


def test_the_emulated_gpu_never_builds_in_a_directory_others_can_write(cache, tmp_path,
                                                                        monkeypatch):
    """With the cache refused, emulated-CUDA libraries (loaded into the process) went to
    /tmp/tclang-cuda-emulation-<uid> whoever had made it; a planted one is now passed by."""
    from backends.cuda.emulation import build
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    planted = tmp_path / f"tclang-cuda-emulation-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    chosen = build.default_cache_dir()
    assert chosen not in (planted, cache / "cuda-emulation")
    info = os.stat(chosen)
    assert info.st_uid == os.getuid() and stat.S_IMODE(info.st_mode) & 0o077 == 0
