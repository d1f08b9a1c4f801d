"""Test helpers for streaming checkpoints."""

from __future__ import annotations

from pathlib import Path


def forget_batch(checkpoint: str, batch: int | None = None) -> int:
    """Delete Spark's commit-log entry of ``batch`` (default: the last one), as when the
    process dies between the sink's commit and Spark's: a restart replays the batch.
    Returns the batch id."""
    commits = Path(checkpoint, "commits")
    if batch is None:
        batch = max(int(p.name) for p in commits.glob("[0-9]*"))
    (commits / str(batch)).unlink()
    (commits / f".{batch}.crc").unlink(missing_ok=True)
    return batch
