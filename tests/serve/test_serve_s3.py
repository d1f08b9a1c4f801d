"""`deltaflow serve` with its table on S3 (SeaweedFS, see ``tests/_object_store.py``):
events acknowledged only once they are in a Delta commit on the object store, written with
delta-rs's conditional put; keys and events survive a restart and a SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from deltalake import DeltaTable

from tests import _object_store
from tests._waiting import wait_until
from tests.serve import test_sigkill
from tests.serve.conftest import make_config

pytestmark = pytest.mark.slow


@pytest.fixture
def s3(object_store: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The store, with its settings in this process's environment (serve reads no other)."""
    for key, value in object_store.env.items():
        monkeypatch.setenv(key, value)
    yield object_store


def s3_rows(store: Any, uri: str) -> list[dict[str, Any]]:
    table = DeltaTable(uri, storage_options=store.storage_options)
    return sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["id"])


def ndjson(*ids: int) -> str:
    return "\n".join(json.dumps({"id": i, "kind": "s3"}) for i in ids)


def test_events_are_committed_on_s3_before_the_ack_and_survive_a_restart(serve, s3, tmp_path):
    uri = s3.uri("events")
    config = make_config(tmp_path, events={"path": uri, "partition_by": ["kind"]})
    first = serve(config)
    ack = first.client.post("events", ndjson(1, 2), key="k-1")
    assert ack.status == 200, ack.body
    assert ack.body == {"table": "events", "version": 1, "rows": 2, "duplicate": False}
    # Read right after the acknowledgement, by another client: already in the table.
    assert [r["id"] for r in s3_rows(s3, uri)] == [1, 2]
    table = DeltaTable(uri, storage_options=s3.storage_options)
    assert table.metadata().partition_columns == ["kind"]
    assert json.loads(table.history(1)[0]["deltaflow.ingest"])["keys"] == [["k-1", 2]]
    assert first.client.request("GET", "/v1/tables/events").body["num_rows"] == 2
    first.stop()

    second = serve(config)
    retry = second.client.post("events", ndjson(1, 2), key="k-1")
    assert retry.body == {**ack.body, "duplicate": True}  # the key came back from the log
    assert second.client.post("events", ndjson(3), key="k-2").status == 200
    assert [r["id"] for r in s3_rows(s3, uri)] == [1, 2, 3]
    assert DeltaTable(uri, storage_options=s3.storage_options).version() == 2


def test_grouped_commits_and_another_writer_on_s3_lose_nothing(serve, s3, tmp_path):
    uri = s3.uri("events")
    server = serve(make_config(tmp_path, events={"path": uri}), group_commit_max_delay_ms=50.0)
    replies = []

    def send(i: int) -> None:
        replies.append(server.client.post("events", ndjson(i, i + 1000), key=f"c-{i}"))

    def other_writer() -> None:
        # Another writer appending to the same table meanwhile: the conditional put makes
        # whichever loses a version retry at the next one, so no commit overwrites another.
        import pyarrow as pa
        from deltalake import write_deltalake

        schema = DeltaTable(uri, storage_options=s3.storage_options).schema().to_arrow()
        for n in range(4):
            row = {f.name: [None] for f in pa.schema(schema)}
            row["id"] = [5000 + n]
            table = pa.table(row, schema=pa.schema(schema))
            write_deltalake(uri, table, mode="append", storage_options=s3.storage_options)

    assert server.client.post("events", ndjson(0)).status == 200  # creates the table
    threads = [threading.Thread(target=send, args=(i,)) for i in range(1, 13)]
    threads.append(threading.Thread(target=other_writer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [r.status for r in replies] == [200] * 12
    assert len({r.body["version"] for r in replies}) < 12  # grouped
    ids = [r["id"] for r in s3_rows(s3, uri)]
    expected = {0, *range(1, 13), *range(1001, 1013), *range(5000, 5004)}
    assert len(ids) == len(expected) and set(ids) == expected
    # Every acknowledged version is a commit file that exists on the store.
    versions = {h["version"] for h in DeltaTable(uri, storage_options=s3.storage_options).history()}
    assert {r.body["version"] for r in replies} <= versions


@pytest.mark.chaos
def test_sigkill_of_serve_on_s3_loses_and_duplicates_nothing(s3):
    uri = s3.uri("events")
    port = test_sigkill.free_port()
    server = test_sigkill.start(uri, port)  # type: ignore[arg-type]
    acknowledged: set[int] = set()
    unanswered: list[tuple[str, bytes, list[int]]] = []
    lock = threading.Lock()
    killed = threading.Event()

    def worker(number: int) -> None:
        sent = 0
        while not killed.is_set() and sent < 500:
            ids = [number * 1_000_000 + sent * 10 + i for i in range(10)]
            sent += 1
            body = "\n".join(json.dumps({"id": i, "kind": "chaos"}) for i in ids).encode()
            key = uuid.uuid4().hex
            status = test_sigkill.post(port, body, key)
            with lock:
                if status == 200:
                    acknowledged.update(ids)
                else:
                    unanswered.append((key, body, ids))

    try:
        test_sigkill.wait_healthy(port)
        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: len(acknowledged) >= 500, 120.0, "load to reach the server")
        os.killpg(server.pid, signal.SIGKILL)
        killed.set()
        server.wait(timeout=30)
        for t in threads:
            t.join(timeout=120)
        server = test_sigkill.start(uri, port)  # type: ignore[arg-type]
        test_sigkill.wait_healthy(port)
        for key, body, ids in unanswered:  # clients retry, with the same keys
            assert test_sigkill.post(port, body, key) == 200
            acknowledged.update(ids)
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    ids = [r["id"] for r in s3_rows(s3, uri)]
    assert len(ids) == len(set(ids)), "an event was committed twice"
    assert set(ids) == acknowledged, "an acknowledged event is missing (or an unknown one appeared)"


def test_a_table_only_deltaflows_log_writer_commits_is_served_on_s3(s3, tmp_path):
    """A clustered table: delta-rs cannot commit it, so serve's groups go through
    deltaflow's log writer, which commits on S3 with a conditional put."""
    import pyarrow as pa
    import pyarrow.fs as pafs

    from deltaflow.ingest.http._table_writer import TableWriter

    uri = s3.uri("clustered")
    schema = {
        "type": "struct",
        "fields": [{"name": "id", "type": "long", "nullable": True, "metadata": {}}],
    }
    actions = [
        {"commitInfo": {"timestamp": 0, "operation": "CREATE TABLE"}},
        {
            "protocol": {
                "minReaderVersion": 1,
                "minWriterVersion": 7,
                "writerFeatures": ["clustering", "domainMetadata"],
            }
        },
        {
            "metaData": {
                "id": str(uuid.uuid4()),
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(schema),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": 0,
            }
        },
        {
            "domainMetadata": {
                "domain": "delta.clustering",
                "configuration": json.dumps({"clusteringColumns": [["id"]]}),
                "removed": False,
            }
        },
    ]
    fs = pafs.S3FileSystem(
        access_key=_object_store.ACCESS_KEY,
        secret_key=_object_store.SECRET_KEY,
        endpoint_override=s3.endpoint,
        region=_object_store.REGION,
        scheme="http",
    )
    log_entry = uri.removeprefix("s3://") + "/_delta_log/" + "0" * 20 + ".json"
    with fs.open_output_stream(log_entry) as stream:
        stream.write("".join(json.dumps(a) + "\n" for a in actions).encode())
    config = make_config(
        tmp_path, events={"path": uri, "schema": None, "tokens_env": None, "allow_anonymous": True}
    )
    writer = TableWriter(config.tables["events"], config)
    rows = pa.table({"id": pa.array([1, 2], pa.int64())})
    assert writer.commit_group([rows], [("key-1", 2)]) == 1
    assert sorted(r["id"] for r in s3_rows(s3, uri)) == [1, 2]
    assert [k for k, _, _ in writer.recover_keys(10)] == ["key-1"]
