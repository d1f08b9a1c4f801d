"""`deltaflow serve` into tables delta-rs 1.6 cannot commit to: clustered tables through
deltaflow's log writer, keys and all; identity tables refused (ingest generates no ids)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from deltaflow.ingest.http._table_writer import COMMIT_INFO_KEY, TableWriter
from deltaflow.table import _commit, _log_write
from deltaflow.table.errors import UnsupportedFeatureError
from tests.serve.conftest import TOKEN, make_config, read_table


def _actions(path: Path, version: int) -> list[dict]:
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json")) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_ingest_into_a_clustered_table(serve, tmp_path: Path):
    config = make_config(tmp_path)
    table = config.tables["events"]
    _log_write.commit_write(
        _commit.CommitRequest(
            table_uri=table.uri,
            schema=table.schema,
            partition_columns=(),
            adds=(),
            clustering_columns=("kind",),
            operation="CREATE TABLE",
        )
    )
    client = serve(config).client
    first = client.post("events", '{"id": 1, "kind": "a"}\n{"id": 2, "kind": "b"}', key="k1")
    assert first.status == 200, first.body
    assert first.body == {"table": "events", "version": 1, "rows": 2, "duplicate": False}
    again = client.post("events", '{"id": 1, "kind": "a"}\n{"id": 2, "kind": "b"}', key="k1")
    assert again.status == 200 and again.body["duplicate"] is True
    second = client.post("events", '{"id": 3, "kind": "c"}')
    assert second.status == 200 and second.body["version"] == 2

    assert [r["id"] for r in read_table(tmp_path / "events")] == [1, 2, 3]
    assert sorted(pl.read_delta(str(tmp_path / "events"))["id"].to_list()) == [1, 2, 3]
    commit = _actions(tmp_path / "events", 1)
    info = next(a["commitInfo"] for a in commit if "commitInfo" in a)
    assert json.loads(info[COMMIT_INFO_KEY])["keys"] == [["k1", 2]]
    assert info["engineInfo"].startswith("deltaflow/")  # the log writer, not delta-rs
    assert info["isBlindAppend"] is True
    domains = [a for a in _actions(tmp_path / "events", 0) if "domainMetadata" in a]
    assert json.loads(domains[0]["domainMetadata"]["configuration"]) == {
        "clusteringColumns": [["kind"]]
    }


def test_identity_tables_are_refused_rather_than_given_null_ids(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("DF_TEST_TOKENS", TOKEN)
    config = make_config(tmp_path)
    table = config.tables["events"]
    assert table.schema is not None
    fields = [
        {**f, "metadata": {"delta.identity.start": 1, "delta.identity.step": 1}}
        if f["name"] == "id"
        else f
        for f in table.schema["fields"]
    ]
    schema = {**table.schema, "fields": fields}
    _log_write.commit_write(
        _commit.CommitRequest(table_uri=table.uri, schema=schema, partition_columns=(), adds=())
    )
    with pytest.raises(UnsupportedFeatureError) as refused:
        TableWriter(replace(table, schema=None), config)
    assert refused.value.feature == "identityColumns"
    assert "id" in str(refused.value)
