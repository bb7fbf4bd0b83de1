"""SQLite store of kernel measurements (standard library only).

One row per (device fingerprint, kernel id, implementation hash, dtype, shape key)
holding the median and minimum time and how many runs they summarize; and, per
generated kernel (by its structural hash), the schedule options a kernel search
chose (`plan.kernel_search`); and, per compiled program (by a hash of its code
as tuned), whether the whole program kept its tuned choices (`plan.step_check`). The file
lives in the user cache dir (`TG_CACHE_DIR` overrides), in WAL mode so readers
never block the writer; writes are single upserts in their own transaction, so
several processes measuring at once lose nothing. A file that cannot be read,
is corrupt or has another schema version is moved aside with a warning and
rebuilt: the database is a cache, it never stops a run.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, TypeVar

SCHEMA_VERSION = 3
_FILE_NAME = "kernels.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS devices (
    fingerprint TEXT PRIMARY KEY,
    description TEXT NOT NULL,
    bandwidth REAL,            -- bytes per second, measured once
    flops REAL,                -- floating-point operations per second, measured once
    overhead REAL,             -- seconds per executed kernel call, measured once
    measured_at REAL
);
CREATE TABLE IF NOT EXISTS measurements (
    fingerprint TEXT NOT NULL,
    kernel TEXT NOT NULL,      -- kernel id, e.g. numpy.matmul, reference.ADD, torch.copy_in
    impl_hash TEXT NOT NULL,   -- hash of the kernel's code and library version: a changed kernel is re-measured
    dtype TEXT NOT NULL,
    shape TEXT NOT NULL,       -- input shapes and parameters, as text
    flops REAL NOT NULL,
    bytes REAL NOT NULL,
    median REAL NOT NULL,      -- seconds
    min REAL NOT NULL,
    count INTEGER NOT NULL,
    measured_at REAL NOT NULL,
    PRIMARY KEY (fingerprint, kernel, impl_hash, dtype, shape)
);
"""
_SCHEDULES = """
CREATE TABLE IF NOT EXISTS schedules (
    fingerprint TEXT NOT NULL,
    kernel TEXT NOT NULL,      -- structural hash of a generated kernel (its code, not its buffers)
    impl_hash TEXT NOT NULL,   -- hash of the code generator: other code, other kernels
    name TEXT NOT NULL,        -- the kernel's name where it was searched (for reading, e.g. k12_add)
    options TEXT NOT NULL,     -- the chosen schedule options, as `ScheduleOptions` prints them
    seconds REAL NOT NULL,     -- its measured time with them
    default_seconds REAL NOT NULL,  -- and with the lowering's own schedule
    candidates INTEGER NOT NULL,    -- distinct schedules measured
    searched_at REAL NOT NULL,
    PRIMARY KEY (fingerprint, kernel, impl_hash)
);
"""
_STEPS = """
CREATE TABLE IF NOT EXISTS steps (
    fingerprint TEXT NOT NULL,
    program TEXT NOT NULL,     -- hash of a compiled program's code with its tuned choices
    impl_hash TEXT NOT NULL,   -- hash of the code generator
    name TEXT NOT NULL,        -- the compiled function it was checked for (for reading)
    kept INTEGER NOT NULL,     -- 1: the program runs its tuned choices, 0: its defaults
    tuned_seconds REAL NOT NULL,    -- the whole program's measured time with its tuned choices
    default_seconds REAL NOT NULL,  -- and with the defaults
    checked_at REAL NOT NULL,
    PRIMARY KEY (fingerprint, program, impl_hash)
);
"""
_SCHEMA += _SCHEDULES + _STEPS
_MIGRATIONS = {1: _SCHEDULES, 2: _STEPS}
"""Version -> what a database of that version lacks next (version 1 had no schedules, version 2 no steps)."""

_UPSERT = """
INSERT INTO measurements VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (fingerprint, kernel, impl_hash, dtype, shape) DO UPDATE SET
    median = (median * count + excluded.median * excluded.count) / (count + excluded.count),
    min = MIN(min, excluded.min),
    count = count + excluded.count,
    measured_at = excluded.measured_at
"""


@dataclass(frozen=True)
class Measurement:
    """One stored row: `median` is the count-weighted mean of the medians of every batch of runs."""

    kernel: str
    impl_hash: str
    dtype: str
    shape: str
    flops: float
    bytes: float
    median: float
    min: float
    count: int
    measured_at: float


@dataclass(frozen=True)
class ScheduleChoice:
    """A kernel search's result: the options text, their time and the default schedule's, how many were tried."""

    name: str
    options: str
    seconds: float
    default_seconds: float
    candidates: int


@dataclass(frozen=True)
class StepVerdict:
    """A step check's result for one compiled program: whether it `kept` its tuned choices, both times measured."""

    name: str
    kept: bool
    tuned_seconds: float
    default_seconds: float


@dataclass(frozen=True)
class DevicePeaks:
    """What a roofline estimate needs: memory bandwidth, arithmetic throughput and per-call overhead."""

    bandwidth: float
    flops: float
    overhead: float


class _StaleSchema(Exception):
    pass


def cache_dir() -> Path:
    """`TG_CACHE_DIR`, else the platform's user cache dir + /tensorgraphs."""
    if os.environ.get("TG_CACHE_DIR"):
        return Path(os.environ["TG_CACHE_DIR"])
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "tensorgraphs"
    if sys.platform == "win32":
        return Path(os.environ.get("LOCALAPPDATA", Path.home())) / "tensorgraphs" / "Cache"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tensorgraphs"


_SQLITE_HEADER_BYTES = 100
"""Every database file sqlite has written holds at least its header; a shorter one was truncated."""


class KernelDB:
    """The measurements of one database file. Connections are opened lazily, one per process.

    `generation` grows with every write made through this object, so in-process
    caches built from the rows (the cost model's fits, the planner's plans) know
    when to rebuild.
    """

    def __init__(self, path: Path | str | None = None) -> None:
        self.path = Path(path) if path is not None else cache_dir() / _FILE_NAME
        self.generation = 0
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1

    # -- connection and recovery --------------------------------------------
    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._pid != os.getpid():  # a forked child must not reuse the parent's
            self._conn = self._open()
            self._pid = os.getpid()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            return self._in_memory(f"cannot create {self.path.parent} ({error})")
        try:
            return self._open_file()
        except sqlite3.OperationalError as error:
            if "locked" in str(error) or "unable to open" in str(error):  # busy or not ours: not broken
                return self._in_memory(f"cannot open {self.path} ({error})")
            self._move_aside(error)
        except (sqlite3.DatabaseError, _StaleSchema) as error:
            self._move_aside(error)
        try:
            return self._open_file()
        except (sqlite3.Error, _StaleSchema, OSError) as error:
            return self._in_memory(f"cannot rebuild {self.path} ({error})")

    def _open_file(self) -> sqlite3.Connection:
        if self.path.exists() and self.path.stat().st_size < _SQLITE_HEADER_BYTES:  # sqlite would take it as new
            raise sqlite3.DatabaseError(f"truncated to {self.path.stat().st_size} bytes")
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout = 60000")
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("integrity check failed")
            self._ensure_schema(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    @staticmethod
    def _ensure_schema(conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION:
            return
        conn.execute("BEGIN IMMEDIATE")  # one process creates the schema; the others wait, then see it
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if version != SCHEMA_VERSION and (version not in (0, *_MIGRATIONS) or (version == 0 and tables)):
                raise _StaleSchema(f"schema version {version}, expected {SCHEMA_VERSION}")
            script = _SCHEMA if version == 0 else "".join(_MIGRATIONS[v] for v in range(version, SCHEMA_VERSION))
            for statement in script.split(";")[:-1]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        finally:
            if conn.in_transaction:
                conn.execute("COMMIT")

    def _move_aside(self, error: Exception) -> None:
        aside = self.path.with_name(f"{self.path.name}.broken-{int(time.time())}-{os.getpid()}")
        try:
            os.replace(self.path, aside)
        except FileNotFoundError:
            pass  # another process moved it already
        except OSError as move_error:
            warnings.warn(f"kernel database {self.path} is unusable ({error}) and cannot be moved ({move_error})",
                          RuntimeWarning, stacklevel=4)
            return
        for suffix in ("-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        warnings.warn(f"kernel database {self.path} was unusable ({error}); moved it to {aside} and started a new "
                      "one (measurements will be taken again)", RuntimeWarning, stacklevel=4)

    def _in_memory(self, why: str) -> sqlite3.Connection:
        warnings.warn(f"kernel database: {why}; keeping measurements in memory for this run", RuntimeWarning,
                      stacklevel=4)
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._ensure_schema(conn)
        return conn

    def _execute(self, sql: str, args: tuple = ()) -> list[tuple]:
        """One statement; a database that fails mid-run is replaced by an in-memory one (warned), never raised."""
        with self._lock:
            try:
                return self._connection().execute(sql, args).fetchall()
            except sqlite3.DatabaseError as error:
                self._conn = self._in_memory(f"{self.path} failed ({error})")
                return self._conn.execute(sql, args).fetchall()

    def close(self) -> None:
        if self._conn is not None and self._pid == os.getpid():
            self._conn.close()
        self._conn = None

    # -- measurements ----------------------------------------------------------
    def record(self, fingerprint: str, kernel: str, impl_hash: str, dtype: str, shape: str, flops: float,
               nbytes: float, samples: list[float]) -> None:
        """Add one batch of timed runs (seconds) of a kernel on one shape."""
        row = (fingerprint, kernel, impl_hash, dtype, shape, flops, nbytes, statistics.median(samples), min(samples),
               len(samples), time.time())
        self._execute(_UPSERT, row)
        self.generation += 1

    def measurements(self, fingerprint: str, kernel: str | None = None) -> list[Measurement]:
        """Rows of one device, of one kernel id or all."""
        query = "SELECT kernel, impl_hash, dtype, shape, flops, bytes, median, min, count, measured_at " \
                "FROM measurements WHERE fingerprint = ?"
        args: tuple = (fingerprint,)
        if kernel is not None:
            query += " AND kernel = ?"
            args += (kernel,)
        return [Measurement(*row) for row in self._execute(query + " ORDER BY kernel, shape", args)]

    def count(self) -> int:
        return self._execute("SELECT count(*) FROM measurements")[0][0]

    # -- schedules of generated kernels ------------------------------------------
    def store_schedule(self, fingerprint: str, kernel: str, impl_hash: str, choice: ScheduleChoice) -> None:
        """The schedule a search chose for a kernel (replacing an earlier one)."""
        self._execute("INSERT OR REPLACE INTO schedules VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                      (fingerprint, kernel, impl_hash, choice.name, choice.options, choice.seconds,
                       choice.default_seconds, choice.candidates, time.time()))
        self.generation += 1

    def schedules(self, fingerprint: str, impl_hash: str) -> dict[str, ScheduleChoice]:
        """Kernel hash -> the schedule chosen for it, for one device and code generator."""
        rows = self._execute("SELECT kernel, name, options, seconds, default_seconds, candidates FROM schedules "
                             "WHERE fingerprint = ? AND impl_hash = ?", (fingerprint, impl_hash))
        return {row[0]: ScheduleChoice(*row[1:]) for row in rows}

    # -- step checks of whole programs ---------------------------------------------
    def store_step(self, fingerprint: str, program: str, impl_hash: str, verdict: StepVerdict) -> None:
        """A step check's verdict on a program (replacing an earlier one)."""
        self._execute("INSERT OR REPLACE INTO steps VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                      (fingerprint, program, impl_hash, verdict.name, int(verdict.kept), verdict.tuned_seconds,
                       verdict.default_seconds, time.time()))
        self.generation += 1

    def steps(self, fingerprint: str, impl_hash: str) -> dict[str, StepVerdict]:
        """Program hash -> the step check's verdict on it, for one device and code generator."""
        rows = self._execute("SELECT program, name, kept, tuned_seconds, default_seconds FROM steps "
                             "WHERE fingerprint = ? AND impl_hash = ?", (fingerprint, impl_hash))
        return {row[0]: StepVerdict(row[1], bool(row[2]), row[3], row[4]) for row in rows}

    # -- devices -----------------------------------------------------------------
    def device_peaks(self, fingerprint: str) -> DevicePeaks | None:
        rows = self._execute("SELECT bandwidth, flops, overhead FROM devices WHERE fingerprint = ? "
                             "AND bandwidth IS NOT NULL", (fingerprint,))
        return DevicePeaks(*rows[0]) if rows else None

    def store_device(self, fingerprint: str, description: str, peaks: DevicePeaks) -> None:
        self._execute("INSERT OR REPLACE INTO devices VALUES (?, ?, ?, ?, ?, ?)",
                      (fingerprint, description, peaks.bandwidth, peaks.flops, peaks.overhead, time.time()))
        self.generation += 1


_DEFAULT: dict[Path, KernelDB] = {}


def default_db() -> KernelDB:
    """The database in the current cache dir (re-read from `TG_CACHE_DIR` on every call)."""
    path = cache_dir() / _FILE_NAME
    if path not in _DEFAULT:
        _DEFAULT[path] = KernelDB(path)
    return _DEFAULT[path]


T = TypeVar("T")


def per_database(made: dict[int, T], make: Callable[[KernelDB], T], db: KernelDB | None = None) -> T:
    """The one `make(db)` of `db` (default: `default_db()`, so `TG_CACHE_DIR` changes take effect), kept in `made`."""
    db = db if db is not None else default_db()
    if id(db) not in made:
        made[id(db)] = make(db)
    return made[id(db)]


class StoredView(Generic[T]):
    """What `read()` returns of `db`, read again only after a write through `db` (its `generation` moved)."""

    def __init__(self, db: KernelDB, read: Callable[[], T]) -> None:
        self.db, self.read = db, read
        self._generation = -1
        self._value: T

    def __call__(self) -> T:
        if self._generation != self.db.generation:
            self._value, self._generation = self.read(), self.db.generation
        return self._value
