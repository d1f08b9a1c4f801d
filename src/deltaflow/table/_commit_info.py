"""What a commit records about itself in ``commitInfo``: operation name, parameters,
metrics, app transaction, for commits delta-rs writes (its ``CommitProperties``) and the
metrics deltaflow's log writer records for a WRITE. Used by :mod:`._commit` and
:mod:`._log_write`.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

from deltalake import CommitProperties, Transaction

from deltaflow.table._commit_conflicts import MAX_COMMIT_RETRIES

if TYPE_CHECKING:
    from deltaflow.table._commit import CommitRequest


# Commit-info key naming the operation where delta-rs wrote its own name ("WRITE",
# "CREATE TABLE"; it refuses to be told another): history() reads this one first.
OPERATION_KEY = "deltaflow.operation"
# Commit-info key: delta-spark's operationParameters where delta-rs records its own under
# the protocol's key and takes no others there (history() shows these instead).
HISTORY_PARAMETERS_KEY = "deltaflow.operationParameters"


def delta_rs_operation(request: CommitRequest) -> str:
    """The operation name delta-rs records for ``request`` (it takes no other)."""
    return "CREATE TABLE" if request.read_version is None else "WRITE"


# Operations that write data as a WRITE does, recording its metrics.
WRITE_OPERATIONS = frozenset(
    {
        "WRITE",
        "CREATE TABLE AS SELECT",
        "REPLACE TABLE AS SELECT",
        "CREATE OR REPLACE TABLE AS SELECT",
    }
)


def write_metrics(request: CommitRequest) -> dict[str, str]:
    """delta-spark's WRITE metrics, from the files' stats (delta-rs records none)."""
    rows = 0
    for add in request.adds:
        with contextlib.suppress(ValueError, TypeError):
            rows += int(json.loads(add.stats).get("numRecords", 0))
    return {
        "numFiles": str(len(request.adds)),
        "numOutputRows": str(rows),
        "numOutputBytes": str(sum(a.size for a in request.adds)),
    }


def commit_properties(
    request: CommitRequest, parameters: dict[str, Any] | None = None
) -> CommitProperties:
    from deltaflow.table._commit import transactions_of

    transactions = [Transaction(a, v) for a, v in transactions_of(request)] or None
    custom: dict[str, Any] = dict(request.commit_info)
    if request.operation != delta_rs_operation(request):
        custom.setdefault(OPERATION_KEY, request.operation)
    if parameters:
        custom["operationParameters"] = {**parameters, **custom.get("operationParameters", {})}
    if request.user_metadata is not None:
        custom["userMetadata"] = request.user_metadata
    if "operationMetrics" not in custom and request.operation in WRITE_OPERATIONS:
        custom["operationMetrics"] = write_metrics(request)
    # delta-rs records no isBlindAppend; delta-spark does on every commit (true for one that
    # only adds files and read nothing), and DESCRIBE HISTORY shows it.
    custom.setdefault(
        "isBlindAppend", request.mode == "append" and not request.removes and request.read is None
    )
    return CommitProperties(
        custom_metadata=custom or None,
        max_commit_retries=MAX_COMMIT_RETRIES,
        app_transactions=transactions,
    )
