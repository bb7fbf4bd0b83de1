"""The kernel database: rows round-trip, concurrent writers lose nothing, broken files are rebuilt."""

from __future__ import annotations

import multiprocessing
import sqlite3

import pytest

from tensorgraphs.kerneldb import SCHEMA_VERSION, DevicePeaks, KernelDB, cache_dir, default_db, device_description
from tensorgraphs.kerneldb.fingerprint import device_fingerprint

FP = "test-device"


def _record(db: KernelDB, shape: str, samples: list[float], kernel: str = "numpy.matmul") -> None:
    db.record(FP, kernel, "h1", "float32,float32", shape, flops=1e6, nbytes=1e4, samples=samples)


def test_rows_round_trip_and_batches_merge(tmp_path):
    db = KernelDB(tmp_path / "k.sqlite")
    _record(db, "[4, 4]x[4, 4]", [3e-6, 1e-6, 2e-6])
    _record(db, "[4, 4]x[4, 4]", [5e-6])
    _record(db, "[8, 8]x[8, 8]", [9e-6], kernel="torch.matmul")
    (row,) = db.measurements(FP, "numpy.matmul")
    assert (row.count, row.min) == (4, 1e-6)
    assert row.median == pytest.approx((2e-6 * 3 + 5e-6) / 4)  # count-weighted mean of the batch medians
    assert db.count() == 2 and len(db.measurements(FP)) == 2 and db.measurements("other-device") == []


def test_wal_mode_and_schema_version(tmp_path):
    db = KernelDB(tmp_path / "k.sqlite")
    db.count()
    conn = sqlite3.connect(db.path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_device_peaks_are_stored_per_fingerprint(tmp_path):
    db = KernelDB(tmp_path / "k.sqlite")
    assert db.device_peaks(FP) is None
    db.store_device(FP, "{}", DevicePeaks(bandwidth=1e10, flops=1e11, overhead=2e-6))
    assert KernelDB(db.path).device_peaks(FP) == DevicePeaks(1e10, 1e11, 2e-6)


def test_fingerprint_names_cpu_cores_compiler_and_libraries():
    assert {"cpu", "cores", "compiler", "numpy", "torch"} <= set(device_description())
    assert device_fingerprint() == device_fingerprint() and len(device_fingerprint()) == 16


def _writer(path: str, worker: int, rows: int) -> None:
    db = KernelDB(path)
    for i in range(rows):
        db.record(FP, "numpy.matmul", "h1", "float32", f"worker{worker}-{i}", 1.0, 1.0, [1e-6])
        db.record(FP, "numpy.matmul", "h1", "float32", "shared", 1.0, 1.0, [1e-6])


def test_concurrent_writers_lose_no_rows(tmp_path):
    path = str(tmp_path / "k.sqlite")
    KernelDB(path).count()  # schema created once; the writers race on rows only
    context = multiprocessing.get_context("spawn")  # forked children would share sqlite locks
    workers = [context.Process(target=_writer, args=(path, w, 50)) for w in range(2)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(60)
    assert [p.exitcode for p in workers] == [0, 0]
    rows = {m.shape: m for m in KernelDB(path).measurements(FP)}
    assert len(rows) == 2 * 50 + 1
    assert rows["shared"].count == 2 * 50  # every conflicting upsert was counted


@pytest.mark.parametrize("damage", ["garbage", "old_schema", "truncated", "emptied"])
def test_broken_file_is_moved_aside_and_rebuilt(tmp_path, damage):
    path = tmp_path / "k.sqlite"
    if damage == "garbage":
        path.write_bytes(b"this is not a database" * 100)
    elif damage == "old_schema":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE measurements (kernel TEXT)")
        conn.execute("PRAGMA user_version = 0")
        conn.commit()
        conn.close()
    else:
        good = KernelDB(path)
        for i in range(200):
            _record(good, f"shape{i}", [1e-6])
        good.close()
        # cut mid-page, or to nothing (sqlite would silently take an empty file for a new database)
        path.write_bytes(path.read_bytes()[:5000] + b"\xff" * 3000 if damage == "truncated" else b"")
    db = KernelDB(path)
    with pytest.warns(RuntimeWarning, match="moved it to"):
        assert db.count() == 0
    _record(db, "[2]", [1e-6])
    assert db.count() == 1
    assert list(tmp_path.glob("k.sqlite.broken-*"))


def test_unusable_directory_keeps_measurements_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    db = KernelDB(blocker / "k.sqlite")
    with pytest.warns(RuntimeWarning, match="in memory"):
        _record(db, "[2]", [1e-6])
    assert db.count() == 1


def test_cache_dir_follows_tg_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    assert default_db().path == tmp_path / "c" / "kernels.sqlite"


def test_a_database_failing_mid_run_is_replaced_in_memory(tmp_path):
    db = KernelDB(tmp_path / "k.sqlite")
    _record(db, "[2]", [1e-6])
    db._conn.close()  # stands in for a file that breaks while the run goes on
    with pytest.warns(RuntimeWarning, match="in memory"):
        _record(db, "[3]", [1e-6])
    assert [m.shape for m in db.measurements(FP)] == ["[3]"]
