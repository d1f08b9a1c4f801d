"""A running `deltaflow serve` keeps committing after the table's metadata and protocol
change under it (ALTER TABLE ... SET TBLPROPERTIES from another writer)."""

from __future__ import annotations

import json
from pathlib import Path

from deltalake import DeltaTable

from tests.serve.conftest import read_table


def test_commits_continue_after_set_tblproperties(serve, tmp_path: Path) -> None:
    client = serve().client
    assert client.post("events", json.dumps({"id": 1})).status == 200
    table = DeltaTable(str(tmp_path / "events"))
    table.alter.set_table_properties({"delta.logRetentionDuration": "interval 31 days"})
    assert client.post("events", json.dumps({"id": 2})).status == 200
    # A protocol change too: the change data feed needs writer version 4.
    table.alter.set_table_properties({"delta.enableChangeDataFeed": "true"})
    reply = client.post("events", json.dumps({"id": 3}))
    assert reply.status == 200, reply.body
    assert [r["id"] for r in read_table(tmp_path / "events")] == [1, 2, 3]
    after = DeltaTable(str(tmp_path / "events"))
    assert after.metadata().configuration["delta.logRetentionDuration"] == "interval 31 days"
    assert after.metadata().configuration["delta.enableChangeDataFeed"] == "true"
