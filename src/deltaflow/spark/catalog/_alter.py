"""The brain's ``catalog.alter``: ALTER TABLE on a Delta table, as one metadata commit.

The connector's catalog (``AlterTable.scala``) sends Spark's ``TableChange``s as JSON
(``{uri, name, changes, checkedVersion?}``). The rules are the table layer's
(:mod:`deltaflow.table._alter`); this module loads the table, settles what existing rows
must be checked, and commits. Answers:

* ``{"committed": true, "version": v}``: the change is in the log at version ``v``;
* ``{"committed": false, "version": v}``: nothing to change (e.g. a type set to itself);
* ``{"check": {"version": v, "checks": [...]}}``: a new CHECK constraint or SET NOT NULL
  needs the rows of version ``v`` checked first (statistics could not prove them). The
  connector counts violating rows with Spark (each check's ``violation`` SQL), refuses
  with :class:`~deltaflow.table.errors.ConstraintViolationError` if any, else calls again
  with ``checkedVersion`` = ``v``; the commit then reads version ``v``, so a write that
  lands in between is a conflict (``ConcurrentAppend``), never an unchecked row.

The commit goes through deltaflow's log writer (``metaData`` and ``protocol`` actions
with delta-spark's commitInfo), so ALTER TABLE needs a local or HDFS-style POSIX table.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from deltaflow.spark.catalog._create import _checked_properties
from deltaflow.table import _alter, _constraints, _log_commit, _uri
from deltaflow.table._alter_state import TableState
from deltaflow.table._protocol import Protocol
from deltaflow.table._snapshot import Snapshot, load_snapshot

log = logging.getLogger("deltaflow.alter")


def alter_from_catalog(args: dict[str, Any]) -> dict[str, Any]:
    uri = _uri.normalize_uri(str(args["uri"]))
    label = str(args.get("name") or uri)
    checked = args.get("checkedVersion")
    _log_commit.require_conditional_put(uri, f"ALTER TABLE {label}")
    snapshot = load_snapshot(uri, version=None if checked is None else int(checked))
    changes = [_canonical(change, label) for change in args.get("changes") or []]
    plan = _alter.plan_alter(state_of(snapshot, label), changes)
    if not plan.changed:
        return {"committed": False, "version": snapshot.version}
    if plan.checks and checked is None:
        pending = _unproven(snapshot, plan)
        if pending:
            return {
                "check": {
                    "version": snapshot.version,
                    "checks": [c.to_json() for c in pending],
                }
            }
    version = commit_alter(snapshot, plan, read_rows=bool(plan.checks))
    log.info("%s on %s committed as version %d", plan.operation, uri, version)
    return {"committed": True, "version": version}


def state_of(snapshot: Snapshot, label: str) -> TableState:
    return TableState(
        uri=snapshot.uri,
        label=label,
        schema=snapshot.schema,
        partition_columns=snapshot.partition_columns,
        configuration={k: v for k, v in snapshot.configuration.items() if v is not None},
        protocol=Protocol(
            snapshot.min_reader_version,
            snapshot.min_writer_version,
            frozenset(snapshot.reader_features),
            frozenset(snapshot.writer_features),
        ),
        description=snapshot.description,
    )


def _canonical(change: dict[str, Any], label: str) -> dict[str, Any]:
    """Property keys in Delta's spelling; unknown ``delta.*`` keys refused."""
    op = change.get("op")
    if op not in ("setProperty", "removeProperty"):
        return change
    key = str(change["key"])
    if key.lower().startswith(_constraints.CONSTRAINT_PREFIX) or key.lower() == "comment":
        return change
    ((name, _),) = _checked_properties({key: str(change.get("value") or "")}, label)
    return {**change, "key": name}


def _unproven(snapshot: Snapshot, plan: _alter.AlterPlan) -> list[_constraints.RowCheck]:
    """The checks statistics cannot settle; refuses at once when they prove nulls."""
    files = snapshot.files() if plan.new_not_null else []
    if not files and plan.new_not_null and not snapshot.files(stats=False):
        return []
    pending = []
    for check in plan.checks:
        if check.kind != "notNull":
            pending.append(check)
            continue
        counts = [_null_count(f.null_counts, check.name.split(".")) for f in files]
        if counts and all(c == 0 for c in counts):
            continue  # every file's stats say: no nulls
        top_level = "." not in check.name
        if top_level and all(c is not None for c in counts) and not snapshot.deleted_rows():
            total = sum(c or 0 for c in counts)
            raise _constraints.violation(snapshot.uri, check, f"{check.name} = null", rows=total)
        pending.append(check)
    return pending


def _null_count(counts: dict[str, Any], path: list[str]) -> int | None:
    value: Any = counts
    for part in path:
        if not isinstance(value, dict):
            return None
        value = next((v for k, v in value.items() if k.lower() == part.lower()), None)
    return int(value) if isinstance(value, int) else None


def commit_alter(snapshot: Snapshot, plan: _alter.AlterPlan, *, read_rows: bool) -> int:
    """One commit with the plan's metadata (and protocol, when it changed)."""
    state = plan.state
    metadata = snapshot.delta_table.metadata()
    action: dict[str, Any] = {
        "id": metadata.id,
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(state.schema, separators=(",", ":")),
        "partitionColumns": list(state.partition_columns),
        "configuration": dict(state.configuration),
        "createdTime": metadata.created_time,
    }
    if metadata.name:
        action["name"] = metadata.name
    if state.description is not None:
        action["description"] = state.description
    return _log_commit.commit(
        _log_commit.LogCommitRequest(
            table_uri=snapshot.uri,
            read_version=snapshot.version,
            operation=plan.operation,
            operation_parameters=plan.parameters,
            metadata=action,
            protocol=state.protocol.to_action() if plan.protocol_changed else None,
            domain_metadata=plan.domains,
            # Checked rows were read whole: any file added or removed since is a conflict.
            read=_log_commit.ReadSet(whole_table=read_rows),
            partitioned=bool(state.partition_columns),
            checkpoint_interval=_log_commit.checkpoint_interval(state.configuration),
        )
    )
