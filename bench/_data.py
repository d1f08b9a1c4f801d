"""Benchmark tables, generated once with pyarrow + delta-rs and cached under bench/.data/."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from _common import DATA_DIR

CATEGORIES = np.array([f"category_{i:02d}" for i in range(50)])
START_US = 1_700_000_000_000_000  # 2023-11-14 UTC


def events(start: int, rows: int, seed: int) -> pa.Table:
    """``rows`` events with ids from ``start``: id, ts (1 ms apart), category, value, qty."""
    rng = np.random.default_rng(seed)
    ids = np.arange(start, start + rows, dtype=np.int64)
    return pa.table(
        {
            "id": ids,
            "ts": pa.array(START_US + ids * 1000, pa.timestamp("us", tz="UTC")),
            "category": pa.array(CATEGORIES[rng.integers(0, len(CATEGORIES), rows)]),
            "value": rng.normal(100.0, 25.0, rows),
            "qty": rng.integers(0, 1000, rows, dtype=np.int32),
        }
    )


def events_table(name: str, rows: int, files: int) -> Path:
    """A Delta table of ``rows`` events in ``files`` files, each holding a contiguous id range."""
    path = DATA_DIR / f"{name}_{rows}_{files}"
    if (path / "_SUCCESS").exists():
        return path
    from deltalake import write_deltalake

    if path.exists():
        shutil.rmtree(path)
    per_file = -(-rows // files)
    for i in range(files):
        start = i * per_file
        count = min(per_file, rows - start)
        write_deltalake(str(path), events(start, count, seed=i), mode="append")
    (path / "_SUCCESS").write_text("")
    return path


def table_files(path: Path) -> list[str]:
    from deltaflow.table._snapshot import load_snapshot

    snapshot = load_snapshot(str(path))
    return [f"file://{path}/{entry.path}" for entry in snapshot.files()]
