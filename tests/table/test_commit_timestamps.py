"""``_commit_timestamp`` without in-commit timestamps: the commit files' modification times
made strictly increasing, found by one stat per new version once the previous one is known,
and equal to what a listing of the whole log gives."""

from __future__ import annotations

import os
from pathlib import Path

from deltaflow.table._cdf import CommitTimestamps


class CountingTimestamps(CommitTimestamps):
    """The real class, counting its listings of ``_delta_log``."""

    listings = 0

    def refresh(self) -> None:
        self.listings += 1
        super().refresh()


def commit(table: Path, version: int, mtime_ms: int) -> None:
    path = table / "_delta_log" / f"{version:020d}.json"
    path.write_text("{}\n")
    os.utime(path, ns=(mtime_ms * 1_000_000, mtime_ms * 1_000_000))


def test_new_versions_cost_a_stat_and_match_the_full_listing(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    # Equal and decreasing file times: each is made one ms later than the previous.
    times = [1_000, 1_000, 900, 5_000, 5_000, 4_000, 7_000]
    commit(tmp_path, 0, times[0])
    following = CountingTimestamps(tmp_path.as_uri())
    assert following.get(0) == 1_000
    for version, ms in enumerate(times[1:], start=1):
        commit(tmp_path, version, ms)
        following.get(version)  # as a stream meets each commit
    assert following.listings == 1
    listed = CommitTimestamps(tmp_path.as_uri()).all()
    assert {v: following.get(v) for v in range(len(times))} == listed
    assert listed == {0: 1_000, 1: 1_001, 2: 1_002, 3: 5_000, 4: 5_001, 5: 5_002, 6: 7_000}


def test_a_version_not_committed_yet_is_none(tmp_path: Path) -> None:
    (tmp_path / "_delta_log").mkdir()
    commit(tmp_path, 0, 1_000)
    timestamps = CommitTimestamps(tmp_path.as_uri())
    assert timestamps.get(0) == 1_000
    assert timestamps.get(1) is None
    commit(tmp_path, 1, 2_000)
    assert timestamps.get(1) == 2_000
