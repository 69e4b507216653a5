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

Like the compile cache (tclang/driver/diskcache.py), the database only saves work, so no problem
with it stops a program: a lookup (`options="tuned"`) that meets a damaged file (not
SQLite, a corrupt page, a foreign schema, a row whose options do not decode or name
unknown knobs) warns once, sets the file aside (renamed `<name>.damaged-<time>`, with its
WAL files) and compiles with the automatic schedule; the next write starts a fresh file. A
locked, full, read-only or unreachable database is left as it is: a lookup warns once and
uses the automatic schedule, `tc.autotune` warns that its result could not be stored and
returns it all the same.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
import warnings
from pathlib import Path

from tclang.errors import TCError, TCWarning
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
#: the columns of each table, in order: a file with other columns is not ours
COLUMNS = {
    "best": ("key", "machine", "version", "entry", "shapes", "options", "seconds",
             "automatic_seconds", "trials", "updated"),
    "trials": ("key", "machine", "version", "options", "status", "seconds",
               "compile_seconds", "message", "host", "at"),
}
WRITE_WAIT_SECONDS = 60.0  # a write waits this long for another tuner's transaction
READ_WAIT_SECONDS = 5.0  # a lookup (a first call with options="tuned") waits less

_warned: set[str] = set()  # lookup problems already reported in this process
_FAILED = object()  # what a guarded use returns when the database could not be used


class _Damaged(Exception):
    """The file holds something tclang cannot read back: not its tuning database."""


def default_path() -> Path:
    configured = os.environ.get("TCLANG_TUNING_DB")
    if configured:
        return Path(configured)
    from tclang.driver.diskcache import cache_dir
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
    from tclang.version import __version__
    return __version__


class TuningDatabase:
    """One SQLite file. Opened per use (a connection is not shared between threads).

    Every public method is guarded (see the module docstring): a problem with the file is
    a TCWarning, never an exception from sqlite3 or json."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.unusable = None  # why there is no path: the cache directory is refused
        try:
            self.path = Path(path) if path is not None else default_path()
        except OSError as err:  # including tclang.driver.diskcache.UntrustedCache
            self.path, self.unusable = None, str(err)

    def record_trials(self, key: str, machine: str, trials) -> bool:
        """Append trials (tclang.tuning.trials.Trial) to the history, in one transaction;
        False (after a warning) if they could not be written."""
        done = self._use(lambda conn: _insert_trials(conn, key, machine, trials),
                         writing=True, what="the trials")
        return done is not _FAILED

    def offer_best(self, key: str, machine: str, entry: str, shapes: tuple,
                   options: Options, seconds: float, automatic_seconds: float | None,
                   trials: int) -> bool:
        """Store `options` as the best for this kernel unless a faster one is stored;
        True if it was stored (False, after a warning, if the database failed)."""
        row = _best_row(key, machine, entry, shapes, options, seconds, automatic_seconds,
                        trials)
        done = self._use(lambda conn: _offer(conn, row), writing=True,
                         what=f"the best options of {entry}")
        return done is True

    def save(self, key: str, machine: str, entry: str, shapes: tuple, options: Options,
             seconds: float, automatic_seconds: float | None, trials: list) -> bool:
        """A tuning's trials and its best, in one transaction: True if the best was stored
        (not beaten by a stored one). A failure warns, naming the options found, so a
        tuning's result is never lost with the database."""
        row = _best_row(key, machine, entry, shapes, options, seconds, automatic_seconds,
                        len(trials))

        def work(conn):
            _insert_trials(conn, key, machine, trials)
            return _offer(conn, row)

        done = self._use(work, writing=True, what=f"the result of tuning {entry} (the "
                         f"returned TuningResult has it; best options: "
                         f"{options.describe()})")
        return done is True

    def best(self, key: str, machine: str, warn: bool = True) -> dict | None:
        """The stored best for this kernel on this machine and version: a dict with
        `options` (an Options), `seconds`, `automatic_seconds`, `trials`; else None.
        Rows for other machines or versions are ignored, with a TCWarning."""
        if self.path is not None and not self.path.exists():
            return None

        def work(conn):
            rows = conn.execute("SELECT machine, version, options, seconds, "
                                "automatic_seconds, trials FROM best WHERE key = ?",
                                (key,)).fetchall()
            mine = [r for r in rows if r[0] == machine and r[1] == version_id()]
            if not mine:
                return rows, None
            _, _, options, seconds, automatic, trials = mine[0]
            return rows, {"options": _decode_options(options), "seconds": seconds,
                          "automatic_seconds": automatic, "trials": trials}

        found = self._use(work, writing=False, what="tuned options")
        if found is _FAILED:
            return None
        rows, mine = found
        if mine is None and rows and warn:
            others = sorted({f"tclang {r[1]}" if r[0] == machine else "another machine"
                             for r in rows})
            warnings.warn(TCWarning(
                f"the tuning database {self.path} has options for this kernel tuned "
                f"on {' and '.join(others)}, not this one: they are ignored (run "
                f"tc.autotune here to tune it for this machine)"), stacklevel=3)
        return mine

    # ---- the guard ----
    def _use(self, work, *, writing: bool, what: str):
        """work(conn) on a fresh connection (one transaction when writing), or _FAILED after
        a warning. A damaged file is set aside; a write then runs once more on a new one."""
        if self.path is None:
            self._warn(f"there is no tuning database ({self.unusable})", what, writing)
            return _FAILED
        for attempt in (1, 2):
            try:
                return self._run(work, writing)
            except (_Damaged, sqlite3.Error, OSError) as err:
                reason = _reason(err)
                if not _is_damage(err):
                    problem = f"the tuning database {self.path} could not be used ({reason})"
                elif attempt == 2:
                    problem = (f"the tuning database {self.path} is damaged again after a "
                               f"new one was started ({reason})")
                elif (moved := self._set_aside()) is None:
                    problem = (f"the tuning database {self.path} is damaged ({reason}) and "
                               "could not be moved aside")
                elif writing:
                    self._warn(f"the tuning database {self.path} was damaged ({reason}): "
                               f"{moved}; a new one is started", None, writing)
                    continue
                else:
                    self._warn(f"the tuning database {self.path} was damaged ({reason}): "
                               f"{moved}", what, writing)
                    return _FAILED
                self._warn(problem, what, writing)
                return _FAILED
        return _FAILED

    def _run(self, work, writing: bool):
        conn = self._connect(WRITE_WAIT_SECONDS if writing else READ_WAIT_SECONDS)
        try:
            if not writing:
                return work(conn)
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
            except BaseException:
                try:
                    conn.execute("ROLLBACK")
                except sqlite3.Error:
                    pass  # SQLite rolled back already (a full disk, an I/O error)
                raise
            conn.execute("COMMIT")
            return result
        finally:
            conn.close()

    def _connect(self, wait: float) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:  # the file found damaged, if it is: only that one is set aside
            self._opened = os.stat(self.path)
        except FileNotFoundError:
            self._opened = None
        conn = sqlite3.connect(self.path, timeout=wait, isolation_level=None)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(wait * 1000)}")
            try:
                conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as err:
                if "locked" in str(err) or "busy" in str(err):
                    raise
                # a file system without shared memory: the rollback journal
            conn.executescript(SCHEMA)
            _check_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _set_aside(self) -> str | None:
        """Rename the damaged file (and its WAL and shared-memory files) to
        `<name>.damaged-<time>-<pid>`: kept for a look, out of the way of a new one. Only
        the file found damaged: one another process put in its place meanwhile stays.
        What was done, or None if the file could not be moved."""
        opened, self._opened = getattr(self, "_opened", None), None
        try:
            now = os.stat(self.path)
            if opened is not None and (now.st_dev, now.st_ino) != (opened.st_dev,
                                                                   opened.st_ino):
                return "another process has replaced it"
            aside = self.path.with_name(f"{self.path.name}.damaged-"
                                        f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
            os.replace(self.path, aside)
        except FileNotFoundError:
            return "another process has moved it"
        except OSError:
            return None
        for suffix in ("-wal", "-shm"):
            try:
                os.replace(f"{self.path}{suffix}", f"{aside}{suffix}")
            except OSError:
                pass
        return f"it was moved to {aside.name}"

    def _warn(self, problem: str, what: str | None, writing: bool) -> None:
        """One TCWarning: for a write, each time (a result may be lost: `what` names it);
        for a lookup, once per problem in this process (each new shape would repeat it)."""
        if what is None:
            message = problem
        elif writing:
            message = f"{problem}; {what} could not be stored"
        else:
            message = f"{problem}; {what} are not used: the automatic schedule runs"
        if not writing:
            if message in _warned:
                return
            _warned.add(message)
        warnings.warn(TCWarning(message), stacklevel=4)


def _insert_trials(conn, key: str, machine: str, trials) -> None:
    # a trial's candidate is its knobs as (name, value) pairs, None where left automatic
    # (tclang.tuning.space.SearchSpace.options)
    rows = [(key, machine, version_id(),
             json.dumps(Options(**{k: v for k, v in t.candidate if v is not None}).to_dict(),
                        sort_keys=True),
             t.status, t.seconds, t.compile_seconds, t.message[:500], t.host, time.time())
            for t in trials]
    conn.executemany("INSERT INTO trials VALUES (?,?,?,?,?,?,?,?,?,?)", rows)


def _best_row(key, machine, entry, shapes, options, seconds, automatic_seconds,
              trials) -> tuple:
    return (key, machine, version_id(), entry, json.dumps(_plain(shapes)),
            json.dumps(options.to_dict(), sort_keys=True), seconds, automatic_seconds,
            trials, time.time())


def _offer(conn, row: tuple) -> bool:
    """The conditional upsert: the row replaces the stored best only if it is faster."""
    changed = conn.execute(
        "INSERT INTO best VALUES (?,?,?,?,?,?,?,?,?,?) "
        "ON CONFLICT (key, machine, version) DO UPDATE SET "
        "options = excluded.options, seconds = excluded.seconds, "
        "automatic_seconds = excluded.automatic_seconds, "
        "trials = best.trials + excluded.trials, updated = excluded.updated "
        "WHERE excluded.seconds < best.seconds", row).rowcount
    if not changed:  # not faster: still count the trials spent on this kernel
        conn.execute("UPDATE best SET trials = trials + ? WHERE key = ? AND "
                     "machine = ? AND version = ?", (row[8], row[0], row[1], row[2]))
    return bool(changed)


def _decode_options(text) -> Options:
    """A stored row's options; _Damaged when they are not the JSON of an Options (bad
    JSON, an unknown knob, a value no Options takes)."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError(f"a {type(data).__name__}, not an object")
        return Options.from_dict(data)
    except (ValueError, TypeError, TCError) as err:  # JSONDecodeError is a ValueError
        raise _Damaged(f"a stored row's options do not decode: {str(err).splitlines()[0]}")


def _check_schema(conn) -> None:
    for table, columns in COLUMNS.items():
        found = tuple(r[1] for r in conn.execute(f"PRAGMA table_info({table})"))
        if found != columns:
            raise _Damaged(f"its table {table} has the columns {', '.join(found)}")


def _is_damage(err: BaseException) -> bool:
    """Whether the file itself is bad (set it aside) rather than busy, full or out of
    reach (leave it): SQLite reports a file that is not a database or a corrupt page as a
    plain DatabaseError, the others as OperationalError."""
    if isinstance(err, _Damaged):
        return True
    return isinstance(err, (sqlite3.IntegrityError, sqlite3.DataError)) or \
        type(err) is sqlite3.DatabaseError


def _reason(err: BaseException) -> str:
    if isinstance(err, OSError):
        return err.strerror or str(err)
    return str(err) or type(err).__name__


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
