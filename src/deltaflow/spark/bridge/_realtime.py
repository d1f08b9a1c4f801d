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
