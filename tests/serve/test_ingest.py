"""HTTP ingest against a real server on 127.0.0.1 and real Delta tables on disk."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from tests.serve.conftest import OTHER_TOKEN, TOKEN, make_config, read_table


def ndjson(*records: dict) -> str:
    return "\n".join(json.dumps(r) for r in records)


def test_ndjson_is_committed_before_the_acknowledgement(serve, tmp_path: Path):
    server = serve()
    reply = server.client.post(
        "events",
        ndjson(
            {"id": 1, "kind": "a", "ts": "2025-01-01T10:00:00Z", "day": "2025-01-01", "value": 1.5},
            {"id": 2, "kind": "b"},
        ),
    )
    assert reply.status == 200, reply.body
    assert reply.body == {"table": "events", "version": 1, "rows": 2, "duplicate": False}
    rows = read_table(tmp_path / "events")  # read right after the ack: already committed
    assert [r["id"] for r in rows] == [1, 2]
    assert rows[0]["day"].isoformat() == "2025-01-01"
    assert rows[0]["ts"].isoformat() == "2025-01-01T10:00:00+00:00"


def test_json_array_and_single_object_bodies(serve, tmp_path: Path):
    client = serve().client
    assert client.post("events", json.dumps([{"id": 1}, {"id": 2}])).status == 200
    single = client.post("events", '{\n  "id": 3\n}', headers={"Content-Type": "application/json"})
    assert single.status == 200, single.body
    assert [r["id"] for r in read_table(tmp_path / "events")] == [1, 2, 3]


def test_concurrent_requests_share_commits(serve, tmp_path: Path):
    server = serve(group_commit_max_delay_ms=50.0)
    replies = []

    def send(i: int) -> None:
        replies.append(server.client.post("events", ndjson({"id": i}, {"id": i + 1000})))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [r.status for r in replies] == [200] * 20
    versions = {r.body["version"] for r in replies}
    assert len(versions) < 20  # grouped: fewer commits than requests
    assert len(read_table(tmp_path / "events")) == 40


def test_schema_drift_rejects_the_whole_request_with_per_record_errors(serve, tmp_path: Path):
    client = serve().client
    body = ndjson({"id": 1}, {"id": "two"}, {"id": 3, "colour": "red"}, {"id": 4, "day": "nope"})
    reply = client.post("events", body)
    assert reply.status == 400
    error = reply.body["error"]
    assert error["code"] == "invalid_records" and error["retryable"] is False
    found = {(r["line"], r["field"]) for r in error["records"]}
    assert found == {(2, "id"), (3, "colour"), (4, "day")}
    assert read_table(tmp_path / "events") == []  # nothing of the request was written


def test_malformed_lines_binary_garbage_and_invalid_utf8(serve, tmp_path: Path):
    client = serve().client
    bad_line = client.post("events", '{"id": 1}\n{"id": 2,,}\n[1, 2]\n')
    assert bad_line.status == 400
    reasons = {r["line"]: r["reason"] for r in bad_line.body["error"]["records"]}
    assert set(reasons) == {2, 3}
    assert "not valid JSON" in reasons[2] and "JSON object" in reasons[3]
    garbage = client.post("events", bytes(range(256)) * 4)
    assert garbage.status == 400 and garbage.body["error"]["code"] == "invalid_records"
    latin1 = client.post("events", b'{"id": 1, "kind": "caf\xe9"}')
    assert latin1.status == 400
    assert "UTF-8" in latin1.body["error"]["records"][0]["reason"]
    assert read_table(tmp_path / "events") == []


def test_empty_bodies(serve):
    client = serve().client
    for body in ("", "\n\n  \n", "[]"):
        reply = client.post("events", body)
        assert reply.status == 400 and reply.body["error"]["code"] == "empty_body", body


def test_huge_lines_and_huge_bodies(serve, tmp_path: Path):
    server = serve(max_event_bytes=10_000, max_body_bytes=100_000)
    huge_line = ndjson({"id": 1}, {"id": 2, "kind": "x" * 20_000})
    reply = server.client.post("events", huge_line)
    assert reply.status == 400
    [record] = reply.body["error"]["records"]
    assert record["line"] == 2 and "max_event_bytes" in record["reason"]
    too_big = server.client.post(
        "events", ndjson(*({"id": i, "kind": "y" * 90} for i in range(2000)))
    )
    assert too_big.status == 413 and too_big.body["error"]["code"] == "body_too_large"
    assert read_table(tmp_path / "events") == []


def test_many_bad_records_are_reported_up_to_a_limit(serve):
    client = serve().client
    body = ndjson(*({"id": f"x{i}"} for i in range(500)))
    error = client.post("events", body).body["error"]
    assert len(error["records"]) == 100 and error["truncated"] is True


def test_duplicate_deliveries_with_an_idempotency_key(serve, tmp_path: Path):
    client = serve().client
    first = client.post("events", ndjson({"id": 1}, {"id": 2}), key="order-42")
    again = client.post("events", ndjson({"id": 1}, {"id": 2}), key="order-42")
    assert first.status == again.status == 200
    assert again.body == {**first.body, "duplicate": True}
    assert [r["id"] for r in read_table(tmp_path / "events")] == [1, 2]
    bad_key = client.post("events", ndjson({"id": 3}), key="has space")
    assert bad_key.status == 400 and bad_key.body["error"]["code"] == "invalid_idempotency_key"


def test_a_retry_in_flight_waits_for_the_first_attempt(serve, tmp_path: Path):
    server = serve(group_commit_max_delay_ms=300.0)
    replies = []
    threads = [
        threading.Thread(
            target=lambda: replies.append(server.client.post("events", ndjson({"id": 7}), key="k7"))
        )
        for _ in range(5)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [r.status for r in replies] == [200] * 5
    assert len({r.body["version"] for r in replies}) == 1
    assert sorted(r.body["duplicate"] for r in replies) == [False, True, True, True, True]
    assert [r["id"] for r in read_table(tmp_path / "events")] == [7]


def test_keys_survive_a_restart(serve, tmp_path: Path):
    config = make_config(tmp_path)
    first = serve(config)
    ack = first.client.post("events", ndjson({"id": 1}), key="before-restart")
    first.stop()
    second = serve(config)
    retry = second.client.post("events", ndjson({"id": 1}), key="before-restart")
    assert retry.body == {**ack.body, "duplicate": True}
    assert len(read_table(tmp_path / "events")) == 1


def test_tokens_are_checked_per_table(serve, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("DF_OTHER_TOKENS", "only-for-other")
    config = make_config(tmp_path, events={}, other={"tokens_env": "DF_OTHER_TOKENS"})
    client = serve(config).client
    missing = client.post("events", ndjson({"id": 1}), token=None)
    assert missing.status == 401 and missing.body["error"]["code"] == "missing_token"
    assert "bearer" in missing.headers["www-authenticate"].lower()
    wrong = client.post("events", ndjson({"id": 1}), token="nope")
    assert wrong.status == 401 and wrong.body["error"]["code"] == "invalid_token"
    assert client.post("other", ndjson({"id": 1}), token=TOKEN).status == 401
    assert client.post("other", ndjson({"id": 1}), token="only-for-other").status == 200
    assert client.post("events", ndjson({"id": 1}), token=OTHER_TOKEN).status == 200
    basic = client.post(
        "events", ndjson({"id": 1}), token=None, headers={"Authorization": f"Basic {TOKEN}"}
    )
    assert basic.status == 401
    assert TOKEN not in repr(config) and "only-for-other" not in repr(config)


def test_only_configured_table_names(serve, tmp_path: Path):
    client = serve().client
    for path in (
        "/v1/tables/nope/events",
        "/v1/tables/..%2F..%2Fetc/events",
        "/v1/tables/../events/events",
        "/v1/tables/events%2F../events",
    ):
        reply = client.request("POST", path, ndjson({"id": 1}))
        assert reply.status == 404, path
        assert reply.body["error"]["code"] in ("unknown_table", "not_found")
    wrong_method = client.request("PUT", "/v1/tables/events/events", ndjson({"id": 1}))
    assert wrong_method.status == 405 and wrong_method.body["error"]["code"] == "method_not_allowed"
    assert not (tmp_path / "etc").exists()


def test_compressed_bodies_are_refused(serve):
    reply = serve().client.post("events", b"\x1f\x8b", headers={"Content-Encoding": "gzip"})
    assert reply.status == 415


def test_table_info_health_and_metrics(serve):
    client = serve().client
    client.post("events", ndjson({"id": 1}, {"id": 2}), key="a")
    client.post("events", ndjson({"id": 1}), key="a")
    client.post("events", ndjson({"id": "bad"}))
    info = client.request("GET", "/v1/tables/events")
    assert info.status == 200
    assert info.body["version"] == 1 and info.body["num_rows"] == 2
    assert info.body["last_commit"]["version"] == 1
    assert client.request("GET", "/v1/tables/events", token=None).status == 401
    health = client.request("GET", "/healthz", token=None)
    assert health.status == 200 and health.body["status"] == "ok"
    metrics = client.request("GET", "/metrics", token=None)
    assert metrics.status == 200
    text = metrics.body
    assert 'deltaflow_ingest_events_total{table="events"} 2' in text
    assert 'deltaflow_ingest_duplicate_requests_total{table="events"} 1' in text
    assert 'deltaflow_ingest_requests_total{status="400",table="events"} 1' in text
    assert 'deltaflow_ingest_commits_total{table="events"} 1' in text
    assert TOKEN not in text


def test_rescue_mode_keeps_unknown_fields(serve, tmp_path: Path):
    config = make_config(tmp_path, events={"unknown_fields": "rescue"})
    client = serve(config).client
    reply = client.post("events", ndjson({"id": 1, "colour": "red", "size": 3}, {"id": 2}))
    assert reply.status == 200, reply.body
    rows = read_table(tmp_path / "events")
    assert json.loads(rows[0]["_rescued_data"]) == {"colour": "red", "size": 3}
    assert rows[1]["_rescued_data"] is None
    assert client.post("events", ndjson({"id": "x", "colour": 1})).status == 400


def test_partitioned_table(serve, tmp_path: Path):
    config = make_config(tmp_path, events={"partition_by": ["kind"]})
    client = serve(config).client
    body = ndjson({"id": 1, "kind": "a"}, {"id": 2, "kind": "b"}, {"id": 3}, {"id": 4, "kind": "a"})
    assert client.post("events", body).status == 200
    rows = read_table(tmp_path / "events")
    assert [(r["id"], r["kind"]) for r in rows] == [(1, "a"), (2, "b"), (3, None), (4, "a")]
    assert (tmp_path / "events" / "kind=a").is_dir()
    import pyarrow as pa
    from deltalake import DeltaTable

    actions = pa.table(
        DeltaTable(str(tmp_path / "events")).get_add_actions(flatten=True)
    ).to_pydict()
    assert len(actions["path"]) == 3 and all(n is not None for n in actions["num_records"])


def test_ingest_commits_get_checkpoints_at_the_default_interval(serve, tmp_path: Path):
    """Log upkeep (issue 14): every ingest commit runs it; a checkpoint every 10 versions."""
    server = serve()
    for i in range(1, 11):
        reply = server.client.post("events", ndjson({"id": i, "kind": "a"}))
        assert reply.status == 200 and reply.body["version"] == i, reply.body
    log = tmp_path / "events" / "_delta_log"
    checkpoints = sorted(p.name for p in log.glob("*.checkpoint.parquet"))
    assert checkpoints == [f"{10:020d}.checkpoint.parquet"]
    assert json.loads((log / "_last_checkpoint").read_text())["version"] == 10
    assert [r["id"] for r in read_table(tmp_path / "events")] == list(range(1, 11))
