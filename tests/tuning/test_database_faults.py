"""The tuning database when it fails: garbage in the file, a row that does not decode, a
full or unreachable disk, a lock another process holds. Like the disk cache, it only saves
work: `options="tuned"` warns once and runs the automatic schedule (a damaged file is set
aside and rebuilt), and `tc.autotune` returns its result even when it cannot store it."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

import tclang as tc
from tclang.driver import tuning_database as database
from tclang.driver.tuning_database import TuningDatabase

ADD = "def add(float(N) A) -> (B) { B(i) = A(i) + 1 }"


def key_of(kernel, *args) -> str:
    from tclang.runtime.arguments import bind_arguments
    from tclang.driver.cachekey import canonical_source
    return database.kernel_key(canonical_source(kernel.definition), kernel.name,
                               bind_arguments(kernel.definition, args).shape_key(),
                               kernel.module.backend)


def this_machine() -> str:
    from tclang.driver.compiler import compile_target
    return database.machine_id(compile_target("cpu", tc.Options()))


def tuned_call(path, monkeypatch, n=8):
    """A first call with options="tuned" for shape (n,): (its options, its result)."""
    monkeypatch.setenv("TCLANG_TUNING_DB", str(path))
    A = np.arange(n, dtype=np.float32)
    kernel = tc.define(ADD, options="tuned").add
    compiled = kernel.compile(A)
    out = kernel(A)
    np.testing.assert_array_equal(out, A + 1)
    return compiled.options, out


def set_aside(path):
    """The damaged files set aside beside `path` (without their WAL and shm files)."""
    return sorted(p for p in path.parent.glob(path.name + ".damaged-*")
                  if not p.name.endswith(("-wal", "-shm")))


def test_garbage_in_the_database_is_set_aside_with_one_warning(tmp_path, monkeypatch):
    path = tmp_path / "tuning.sqlite"
    path.write_bytes(b"this is not SQLite\n" * 300)
    with pytest.warns(tc.TCWarning, match="damaged.*moved to.*automatic schedule runs"):
        options, _ = tuned_call(path, monkeypatch)
    assert options == tc.Options()
    assert len(set_aside(path)) == 1 and not path.exists()
    with _no_warning():  # the file is gone: later shapes find nothing, silently
        tuned_call(path, monkeypatch, n=9)
    # and the next write starts a fresh database that a lookup reads back
    A = np.zeros(8, np.float32)
    db = TuningDatabase(path)
    assert db.offer_best(key_of(tc.define(ADD).add, A), this_machine(), "add", (),
                         tc.Options(unroll=2), 1e-3, 2e-3, 3)
    with _no_warning():
        options, _ = tuned_call(path, monkeypatch)
    assert options == tc.Options(unroll=2)


@pytest.mark.parametrize("stored", ['{"unroll": 2', '{"warp_shuffle": 4}', '[2]',
                                    '{"unroll": "many"}'],
                         ids=["bad-json", "unknown-knob", "not-an-object", "bad-value"])
def test_a_row_whose_options_do_not_decode_is_set_aside(stored, tmp_path, monkeypatch):
    path = tmp_path / "tuning.sqlite"
    A = np.zeros(8, np.float32)
    assert TuningDatabase(path).offer_best(key_of(tc.define(ADD).add, A), this_machine(),
                                           "add", (), tc.Options(unroll=2), 1e-3, 2e-3, 3)
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE best SET options = ?", (stored,))
    with pytest.warns(tc.TCWarning, match="damaged.*options do not decode"):
        options, _ = tuned_call(path, monkeypatch)
    assert options == tc.Options() and len(set_aside(path)) == 1


def test_a_database_with_another_schema_is_set_aside_and_rebuilt_by_a_write(tmp_path):
    path = tmp_path / "tuning.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE best (key TEXT PRIMARY KEY, options TEXT)")
    db = TuningDatabase(path)
    with pytest.warns(tc.TCWarning, match="damaged.*columns.*a new one is started"):
        assert db.offer_best("k", "m", "add", (), tc.Options(unroll=2), 1e-3, None, 1)
    assert len(set_aside(path)) == 1
    assert db.best("k", "m")["options"] == tc.Options(unroll=2)


class _FullDisk(sqlite3.Connection):
    """A connection on a disk with no room left: every write fails as SQLite says it."""

    def execute(self, sql, *args):
        if sql.lstrip().upper().startswith(("INSERT", "UPDATE")):
            raise sqlite3.OperationalError("database or disk is full")
        return super().execute(sql, *args)

    def executemany(self, sql, *args):
        raise sqlite3.OperationalError("database or disk is full")


def test_autotune_returns_its_result_when_the_disk_is_full(tmp_path, monkeypatch):
    real = sqlite3.connect
    monkeypatch.setattr(sqlite3, "connect",
                        lambda *a, **k: real(*a, **{**k, "factory": _FullDisk}))
    A = np.arange(8, dtype=np.float32)
    path = tmp_path / "tuning.sqlite"
    with pytest.warns(tc.TCWarning, match="disk is full.*result of tuning add.*could not "
                                          "be stored"):
        result = tc.autotune(tc.define(ADD).add, A, budget=1, min_time=0.001, jobs=1,
                             progress=False, database=path)
    assert not result.stored and result.trials and result.best_seconds > 0
    assert not set_aside(path)  # a full disk is no damage: the file stays


def test_autotune_returns_its_result_when_the_database_cannot_be_made(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path = blocker / "tuning.sqlite"  # its directory is a file: nothing can be made there
    A = np.arange(8, dtype=np.float32)
    with pytest.warns(tc.TCWarning, match="could not be used.*could not be stored"):
        result = tc.autotune(tc.define(ADD).add, A, budget=1, min_time=0.001, jobs=1,
                             progress=False, database=path)
    assert not result.stored and result.best_seconds > 0


def test_a_locked_database_is_waited_for_then_left_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(database, "READ_WAIT_SECONDS", 0.2, raising=False)
    monkeypatch.setattr(database, "WRITE_WAIT_SECONDS", 0.2, raising=False)
    path = tmp_path / "tuning.sqlite"
    A = np.zeros(8, np.float32)
    key = key_of(tc.define(ADD).add, A)
    db = TuningDatabase(path)
    assert db.offer_best(key, this_machine(), "add", (), tc.Options(unroll=2), 1e-3, None, 1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")  # readers and writers alike are shut out
    try:
        with pytest.warns(tc.TCWarning, match="locked.*automatic schedule runs") as seen:
            options, _ = tuned_call(path, monkeypatch)
            tuned_call(path, monkeypatch, n=9)  # another shape: no second warning
        assert options == tc.Options()
        assert len([w for w in seen if "locked" in str(w.message)]) == 1
        with pytest.warns(tc.TCWarning, match="locked.*could not be stored"):
            assert not db.offer_best(key, this_machine(), "add", (), tc.Options(unroll=4),
                                     1e-4, None, 1)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert not set_aside(path)  # a lock is no damage
    assert db.best(key, this_machine())["options"] == tc.Options(unroll=2)


class _no_warning:
    """Any TCWarning inside the block fails the test."""

    def __enter__(self):
        import warnings
        self.catcher = warnings.catch_warnings()
        self.catcher.__enter__()
        warnings.simplefilter("error", tc.TCWarning)

    def __exit__(self, *exc):
        return self.catcher.__exit__(*exc)


def test_a_refused_cache_directory_means_no_tuned_options_not_an_error(tmp_path,
                                                                       monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # others could write it: the disk cache and its database are off
    monkeypatch.setenv("TCLANG_CACHE_DIR", str(shared))
    monkeypatch.delenv("TCLANG_TUNING_DB", raising=False)
    A = np.arange(8, dtype=np.float32)
    with pytest.warns(tc.TCWarning, match="no tuning database.*writable by group"):
        compiled = tc.define(ADD, options="tuned").add.compile(A)
    assert compiled.options == tc.Options()
    np.testing.assert_array_equal(compiled(A), A + 1)
