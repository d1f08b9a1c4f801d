"""A running `deltaflow serve` keeps committing after the table's metadata and protocol
change under it (ALTER TABLE ... SET TBLPROPERTIES from another writer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
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


def test_columns_added_by_another_writer_are_served_without_a_restart(
    serve, tmp_path: Path
) -> None:
    from deltalake.schema import Field

    client = serve().client
    assert client.post("events", json.dumps({"id": 1})).status == 200
    DeltaTable(str(tmp_path / "events")).alter.add_columns([Field("source", "string", True)])
    # The service has not committed since the ALTER: the new field is taken on first sight.
    reply = client.post("events", json.dumps({"id": 2, "source": "app"}))
    assert reply.status == 200, reply.body
    # A request without it, and a field the table still lacks, behave as before.
    assert client.post("events", json.dumps({"id": 3})).status == 200
    refused = client.post("events", json.dumps({"id": 4, "nope": 1}))
    assert refused.status == 400 and refused.body["error"]["records"][0]["field"] == "nope"
    rows = read_table(tmp_path / "events")
    assert [(r["id"], r["source"]) for r in rows] == [(1, None), (2, "app"), (3, None)]


def test_a_group_parsed_before_the_alter_commits_with_the_new_column_null(
    serve, tmp_path: Path
) -> None:
    from deltalake.schema import Field

    client = serve().client
    assert client.post("events", json.dumps({"id": 1})).status == 200
    DeltaTable(str(tmp_path / "events")).alter.add_columns([Field("source", "string", True)])
    # Parsed with the old schema; its commit meets the ALTER and takes the new schema.
    assert client.post("events", json.dumps({"id": 2})).status == 200
    assert client.post("events", json.dumps({"id": 3, "source": "web"})).status == 200
    schema = DeltaTable(str(tmp_path / "events")).schema()
    assert [f.name for f in schema.fields][-1] == "source"
    rows = read_table(tmp_path / "events")
    assert [(r["id"], r["source"]) for r in rows] == [(1, None), (2, None), (3, "web")]


def test_an_incompatible_schema_change_refuses_commits_and_says_restart(
    serve, tmp_path: Path
) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    client = serve().client
    assert client.post("events", json.dumps({"id": 1})).status == 200
    path = str(tmp_path / "events")
    # Another writer replaces the table with id as a string: serve's parser writes BIGINT.
    write_deltalake(
        path,
        pa.table({"id": ["a"]}),
        mode="overwrite",
        schema_mode="overwrite",
    )
    for event in ({"id": 2}, {"id": 3}):
        reply = client.post("events", json.dumps(event))
        assert reply.status == 503, reply.body
        assert reply.body["error"]["code"] == "commit_failed"
        assert "restart deltaflow serve" in reply.body["error"]["message"]
    after = DeltaTable(path)
    assert after.to_pyarrow_table().to_pylist() == [{"id": "a"}]


def test_one_group_of_requests_parsed_before_and_after_the_alter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    from deltalake.schema import Field

    from deltaflow.ingest.http._table_writer import TableWriter
    from tests.serve.conftest import TOKEN, make_config

    monkeypatch.setenv("DF_TEST_TOKENS", TOKEN)
    config = make_config(tmp_path)
    writer = TableWriter(config.tables["events"], config)
    before = writer.arrow_schema
    DeltaTable(str(tmp_path / "events")).alter.add_columns([Field("source", "string", True)])
    assert writer.refresh_schema() and not writer.refresh_schema()
    old = pa.Table.from_pylist([{"id": 1}], schema=before)
    new = pa.Table.from_pylist([{"id": 2, "source": "app"}], schema=writer.arrow_schema)
    writer.commit_group([old, new], [])
    rows = read_table(tmp_path / "events")
    assert [(r["id"], r["source"]) for r in rows] == [(1, None), (2, "app")]
