"""The bridge's side of the real-time mode sink (``jvm/.../RealTimeCommits.scala``).

A real-time epoch commits many times: each task's rows, every commit interval, as one
Delta commit with the app transaction ``<app id>/rtm-p<partition>`` at version
``epoch << 32 | rows``: the rows of that partition the table holds for the epoch. A
replayed epoch asks here how many rows that is, and drops them.
"""

from __future__ import annotations

from typing import Any

from deltalake import DeltaTable

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _uri
from deltaflow.table._snapshot import table_exists

# The commit interval's bounds (ms). Shorter than 5 ms would only queue commits behind
# each other (a local Delta commit takes ~15 ms); longer than 10 s is micro-batch's job.
COMMIT_INTERVAL_DEFAULT_MS = 50
COMMIT_INTERVAL_MIN_MS = 5
COMMIT_INTERVAL_MAX_MS = 10_000
COMMIT_INTERVAL_OPTION = "realTimeCommitIntervalMs"


def commit_interval_ms(options: dict[str, str]) -> int:
    """The sink's ``realTimeCommitIntervalMs`` option, checked (typed error when wrong)."""
    raw = next((v for k, v in options.items() if k.lower() == COMMIT_INTERVAL_OPTION.lower()), None)
    if raw is None:
        return COMMIT_INTERVAL_DEFAULT_MS
    try:
        value = int(str(raw).strip())
    except ValueError:
        value = -1
    if not COMMIT_INTERVAL_MIN_MS <= value <= COMMIT_INTERVAL_MAX_MS:
        raise InvalidOptionError(
            f"realTimeCommitIntervalMs is {raw!r}: give a whole number of milliseconds from"
            f" {COMMIT_INTERVAL_MIN_MS} to {COMMIT_INTERVAL_MAX_MS} (default"
            f" {COMMIT_INTERVAL_DEFAULT_MS}). Shorter means fresher rows and more, smaller"
            " commits and files.",
            option=COMMIT_INTERVAL_OPTION,
        )
    return value


def transactions(args: dict[str, Any]) -> dict[str, Any]:
    """``sink.transactions``: ``{path, appIds}`` -> ``{versions: {appId: version | None}}``,
    the app transactions' versions in the table's log now (and the commit interval)."""
    uri = _uri.normalize_uri(str(args["path"]))
    options = {str(k): str(v) for k, v in (args.get("options") or {}).items()}
    interval = commit_interval_ms(options)
    app_ids = [str(a) for a in args.get("appIds") or []]
    if not app_ids or not table_exists(uri):
        return {"versions": dict.fromkeys(app_ids), "intervalMs": interval}
    table = DeltaTable(_uri.delta_rs_uri(uri))
    versions = {app_id: table.transaction_version(app_id) for app_id in app_ids}
    return {"versions": versions, "intervalMs": interval}


def commit_rolls(args: dict[str, Any]) -> dict[str, Any]:
    """``sink.commitRolls``: the rolls several partitions handed over within one commit
    interval, as one Delta commit carrying each partition's app transaction.

    ``args`` is ``write.plan``'s (``stream`` names the first roll's app transaction) plus
    ``rolls``: ``[{directory, appId, version}]``, each a staged directory its task wrote.
    Every transaction is checked against the log atomically with the commit: all there
    (a replay) commits nothing, some there fails the commit (``ConcurrentWriteError``) and
    the query replays. -> ``{route, version, files, skipped}``; a table the connector's
    file write cannot take answers ``{route: "python"}`` with nothing moved.
    """
    from deltaflow.spark.bridge import _ops
    from deltaflow.spark.stream._writer import commit_batch
    from deltaflow.spark.write._files import delete_files
    from deltaflow.spark.write._native import collect_staged, rows_in

    rolls = [(str(r["directory"]), str(r["appId"]), int(r["version"])) for r in args["rolls"]]
    if not rolls:
        return {"route": "jvm", "version": None, "files": 0, "skipped": True}
    planned = _ops.plan_write({**args, "staging": rolls[0][0]})
    if planned.get("route") != "jvm":
        return {"route": str(planned.get("route"))}
    pending = _ops.take_pending(str(planned["handle"]))
    assert pending is not None  # planned just now, on this thread
    moved: list[Any] = []
    try:
        for directory, _, _ in rolls:
            moved.extend(collect_staged(pending.plan, pending.native, directory, pending.job_id))
    except BaseException:
        delete_files(pending.plan.table_uri, moved)
        raise
    (_, first_app, first_version), more = rolls[0], rolls[1:]
    query_id = str((args.get("stream") or {}).get("streamQueryId") or first_app)
    result = commit_batch(
        pending.plan,
        moved,
        query_id=query_id,
        app_id=first_app,
        batch_id=first_version,
        num_rows=rows_in(moved),
        table=pending.table,
        more_transactions=tuple((app, version) for _, app, version in more),
    )
    return {
        "route": "jvm",
        "version": result.version,
        "files": len(moved),
        "skipped": result.skipped,
    }
