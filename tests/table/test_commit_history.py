"""A log whose commitInfo delta-rs cannot parse (delta-spark writes ``readVersion: -1`` on a
shallow clone's version 0) still gives its history and its time travel by timestamp."""

from __future__ import annotations

import datetime as dt
import json
import os

import pyarrow as pa
from deltalake import write_deltalake

from deltaflow.table._snapshot import load_snapshot


def _set_read_version(path: str, version: int, value: int) -> None:
    entry = os.path.join(path, "_delta_log", f"{version:020d}.json")
    with open(entry) as handle:
        actions = [json.loads(line) for line in handle if line.strip()]
    for action in actions:
        if "commitInfo" in action:
            action["commitInfo"]["readVersion"] = value
    with open(entry, "w") as handle:
        handle.writelines(json.dumps(a) + "\n" for a in actions)


def test_history_and_timestamp_travel_read_a_negative_read_version(tmp_path):
    path = str(tmp_path / "t")
    for ids in ([1], [2], [3]):
        write_deltalake(path, pa.table({"id": ids}), mode="append")
    _set_read_version(path, 0, -1)

    snapshot = load_snapshot(path)
    history = snapshot.history()
    assert [c["version"] for c in history] == [2, 1, 0]
    assert history[-1]["readVersion"] == -1
    assert [c["version"] for c in snapshot.history(2)] == [2, 1]

    stamp = history[1]["timestamp"]  # version 1's commit time
    at = dt.datetime.fromtimestamp(stamp / 1000, tz=dt.timezone.utc)
    assert load_snapshot(path, timestamp=at.isoformat()).version == 1
