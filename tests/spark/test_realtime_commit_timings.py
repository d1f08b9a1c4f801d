"""The brain's per-epoch timing line of real-time commits (issue 28, rtm-next M1): the
steps of real log commits, collected per thread, one line per query and epoch."""

from __future__ import annotations

import logging

from deltaflow import _step_times
from deltaflow.spark.bridge import _realtime
from tests.table.test_log_commit_next_version import _append


def test_one_line_per_epoch_with_the_log_writes_steps(tmp_path, caplog) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": pa.array([0], pa.int64())}))
    times = _realtime._EpochTimes()
    caplog.set_level(logging.INFO, logger="deltaflow.realtime.commits")
    for n, epoch in ((1, 0), (2, 0), (3, 1)):
        with _step_times.collect() as steps:
            _append(path, [n], read_version=n - 1)
        times.record("q1", epoch, steps)
    assert len(times.lines) == 1  # epoch 0 ended when epoch 1's first commit came
    line = times.lines[0]
    assert line.startswith("real-time commits of query q1 epoch 0: ")
    for step in ("write+fsync 2x", "link 2x", "dir fsync 2x", "upkeep 2x"):
        assert step in line, line
    assert "conflict scan" not in line  # no race lost: nothing read back
    times.flush()
    assert times.lines[-1].startswith("real-time commits of query q1 epoch 1: ")
    assert [r.getMessage() for r in caplog.records] == times.lines
