"""The tuning database: the best options found for each kernel, the times measured, and the
history of every trial, in SQLite.

Where: `TCLANG_TUNING_DB`, else `tuning.sqlite` in the compile cache's directory; or the
path a caller gives. Keyed like the compile cache minus the options: the definition's
canonical source, the entry, the shapes, dtypes and layout keys of the inputs, the backend.
Each row also records the machine (the backend's Target, which names the CPU, its features
and its core count, or the GPU) and the tclang version: a row from another machine or
version is ignored with a warning, since options tuned there prove nothing here.

Several tuners may write one database at once (processes, Dask workers on a shared
file system): every write is one transaction, WAL journal, a busy timeout, and the best
row is replaced only by a faster one (a conditional upsert), so the file stays valid and
the best stays the best.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import warnings
from pathlib import Path

from tclang.errors import TCWarning
from tclang.options import Options

SCHEMA = """
CREATE TABLE IF NOT EXISTS best (
    key TEXT NOT NULL, machine TEXT NOT NULL, version TEXT NOT NULL,
    entry TEXT NOT NULL, shapes TEXT NOT NULL, options TEXT NOT NULL,
    seconds REAL NOT NULL, automatic_seconds REAL, trials INTEGER NOT NULL,
    updated REAL NOT NULL,
    PRIMARY KEY (key, machine, version)
);
CREATE TABLE IF NOT EXISTS trials (
    key TEXT NOT NULL, machine TEXT NOT NULL, version TEXT NOT NULL,
    options TEXT NOT NULL, status TEXT NOT NULL, seconds REAL, compile_seconds REAL,
    message TEXT, host TEXT, at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS trials_by_key ON trials (key, machine, version);
"""


def default_path() -> Path:
    configured = os.environ.get("TCLANG_TUNING_DB")
    if configured:
        return Path(configured)
    from tclang.diskcache import cache_dir
    return Path(cache_dir()) / "tuning.sqlite"


def kernel_key(canonical_source: str, entry: str, shapes: tuple, backend: str) -> str:
    """The compile cache's key without the options (and without the target, which is the
    `machine` column)."""
    text = repr((("source", canonical_source), ("entry", entry), ("shapes", shapes),
                 ("backend", backend)))
    return hashlib.sha256(text.encode()).hexdigest()[:40]


def machine_id(target) -> str:
    """The machine a time was measured on: its backend's Target, bounds checks aside."""
    fields = tuple((k, v) for k, v in target.key() if k != "bounds_checked")
    return hashlib.sha256(repr(fields).encode()).hexdigest()[:16]


def version_id() -> str:
    import tclang
    return tclang.__version__


class TuningDatabase:
    """One SQLite file. Opened per use (a connection is not shared between threads)."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else default_path()

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        conn.execute("PRAGMA busy_timeout = 60000")
        try:
            conn.execute("PRAGMA journal_mode = WAL")
        except sqlite3.OperationalError:  # a file system without shared memory: rollback
            pass
        conn.executescript(SCHEMA)
        return conn

    def record_trials(self, key: str, machine: str, trials) -> None:
        """Append trials (tclang.tuning.trials.Trial) to the history, in one transaction."""
        from tclang.tuning.space import SearchSpace
        rows = [(key, machine, version_id(),
                 json.dumps(SearchSpace.options(t.candidate).to_dict(), sort_keys=True),
                 t.status, t.seconds, t.compile_seconds, t.message[:500], t.host, time.time())
                for t in trials]
        with self._transaction() as conn:
            conn.executemany("INSERT INTO trials VALUES (?,?,?,?,?,?,?,?,?,?)", rows)

    def offer_best(self, key: str, machine: str, entry: str, shapes: tuple,
                   options: Options, seconds: float, automatic_seconds: float | None,
                   trials: int) -> bool:
        """Store `options` as the best for this kernel unless a faster one is stored;
        True if it was stored."""
        row = (key, machine, version_id(), entry, json.dumps(_plain(shapes)),
               json.dumps(options.to_dict(), sort_keys=True), seconds, automatic_seconds,
               trials, time.time())
        with self._transaction() as conn:
            changed = conn.execute(
                "INSERT INTO best VALUES (?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (key, machine, version) DO UPDATE SET "
                "options = excluded.options, seconds = excluded.seconds, "
                "automatic_seconds = excluded.automatic_seconds, "
                "trials = best.trials + excluded.trials, updated = excluded.updated "
                "WHERE excluded.seconds < best.seconds", row).rowcount
            if not changed:  # not faster: still count the trials spent on this kernel
                conn.execute("UPDATE best SET trials = trials + ? WHERE key = ? AND "
                             "machine = ? AND version = ?", (trials, key, machine,
                                                             version_id()))
        return bool(changed)

    def best(self, key: str, machine: str, warn: bool = True) -> dict | None:
        """The stored best for this kernel on this machine and version: a dict with
        `options` (an Options), `seconds`, `automatic_seconds`, `trials`; else None.
        Rows for other machines or versions are ignored, with a TCWarning."""
        if not self.path.exists():
            return None
        conn = self._connect()  # a plain read: no write lock for a lookup
        try:
            rows = conn.execute("SELECT machine, version, options, seconds, "
                                "automatic_seconds, trials FROM best WHERE key = ?",
                                (key,)).fetchall()
        finally:
            conn.close()
        mine = [r for r in rows if r[0] == machine and r[1] == version_id()]
        if not mine:
            if rows and warn:
                others = sorted({f"tclang {r[1]}" if r[0] == machine else "another machine"
                                 for r in rows})
                warnings.warn(TCWarning(
                    f"the tuning database {self.path} has options for this kernel tuned "
                    f"on {' and '.join(others)}, not this one: they are ignored (run "
                    f"tc.autotune here to tune it for this machine)"), stacklevel=3)
            return None
        _, _, options, seconds, automatic, trials = mine[0]
        return {"options": Options.from_dict(json.loads(options)), "seconds": seconds,
                "automatic_seconds": automatic, "trials": trials}

    def history(self, key: str, machine: str) -> list[dict]:
        with self._transaction() as conn:
            rows = conn.execute("SELECT options, status, seconds, compile_seconds, message, "
                                "host, at FROM trials WHERE key = ? AND machine = ? AND "
                                "version = ? ORDER BY at", (key, machine, version_id()))
            names = [d[0] for d in rows.description]
            return [dict(zip(names, r)) for r in rows.fetchall()]

    def _transaction(self):
        return _Transaction(self)


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT on a fresh connection (ROLLBACK on an exception)."""

    def __init__(self, db: TuningDatabase):
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.conn = self.db._connect()
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind, value, tb) -> None:
        try:
            self.conn.execute("ROLLBACK" if kind else "COMMIT")
        finally:
            self.conn.close()


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
