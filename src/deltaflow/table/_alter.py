"""ALTER TABLE as Delta log rules: the table's next metadata (and protocol), or a refusal.

:func:`plan_alter` takes the table as it is (:class:`TableState`) and a list of changes
(plain dicts, one per Spark ``TableChange``, see :data:`CHANGE_OPS`) and returns the
whole new state for one metadata commit (:class:`AlterPlan`), with delta-spark's
operation name and parameters for the commitInfo, and the checks existing rows must
pass first (a new CHECK constraint, SET NOT NULL). Anything it cannot do right raises a
typed error; nothing here touches storage. The rules are delta-spark's:

* RENAME and DROP COLUMN need column mapping; ``delta.columnMapping.mode`` = ``name``
  on an unmapped table assigns ids and physical names (the current names, so no data
  file is rewritten) and raises the protocol to reader 2 / writer 5;
* a column's type changes only to itself, or by type widening when
  ``delta.enableTypeWidening`` is on (recorded in the field's ``delta.typeChanges``);
* columns a CHECK constraint uses cannot be renamed or dropped; partition columns
  cannot be dropped or change type;
* table properties: ``delta.feature.X`` = ``supported`` and the ``delta.enable*`` /
  ``delta.columnMapping.mode`` properties raise the protocol minimally
  (:mod:`deltaflow.table._protocol`); constraints are changed with ADD/DROP CONSTRAINT
  only; ``delta.minReaderVersion`` / ``delta.minWriterVersion`` only go up.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _alter_columns as columns
from deltaflow.table import _alter_properties as properties
from deltaflow.table import _constraints
from deltaflow.table._alter_state import Change, TableState, Work
from deltaflow.table._protocol import (
    features_in_use,
)
from deltaflow.table.errors import (
    UnsupportedFeatureError,
)

CHANGE_OPS = {
    "addColumn": "ADD COLUMNS",
    "dropColumn": "DROP COLUMNS",
    "renameColumn": "RENAME COLUMN",
    "updateColumnType": "CHANGE COLUMN",
    "updateColumnNullability": "CHANGE COLUMN",
    "updateColumnComment": "CHANGE COLUMN",
    "updateColumnPosition": "CHANGE COLUMN",
    "setProperty": "SET TBLPROPERTIES",
    "removeProperty": "UNSET TBLPROPERTIES",
    "addConstraint": "ADD CONSTRAINT",
    "dropConstraint": "DROP CONSTRAINT",
    "clusterBy": "CLUSTER BY",
}


@dataclass(frozen=True)
class AlterPlan:
    state: TableState
    operation: str
    parameters: dict[str, Any]
    # Rules existing rows must pass before the commit (new constraints, SET NOT NULL).
    checks: tuple[_constraints.RowCheck, ...] = ()
    new_not_null: tuple[tuple[str, ...], ...] = ()
    changed: bool = True
    protocol_changed: bool = False
    metadata_changed: bool = True
    domains: tuple[dict[str, Any], ...] = ()


def plan_alter(state: TableState, changes: Sequence[Change]) -> AlterPlan:
    """The table after ``changes``, all in one commit, or a typed error."""
    if not changes:
        raise InvalidOptionError(f"ALTER TABLE {state.label}: no change given.", option="changes")
    work = Work(
        state=state,
        schema=copy.deepcopy(state.schema),
        configuration=dict(state.configuration),
        partition_columns=list(state.partition_columns),
        description=state.description,
    )
    for change in changes:
        _apply(work, change)
    operation = CHANGE_OPS.get(str(changes[0].get("op")), "SET TBLPROPERTIES")
    protocol = state.protocol.with_features(
        work.features, features_in_use(work.configuration, work.schema)
    )
    protocol = properties.raised_to(protocol, work.minimum, state)
    new_state = replace(
        state,
        schema=work.schema,
        configuration=work.configuration,
        partition_columns=tuple(work.partition_columns),
        protocol=protocol,
        description=work.description,
    )
    metadata_changed = (
        work.schema != state.schema
        or work.configuration != state.configuration
        or tuple(work.partition_columns) != state.partition_columns
        or work.description != state.description
        or work.touched_metadata
    )
    parameters = dict(work.parameters)
    if work.log_columns:
        parameters["columns"] = json.dumps(work.log_columns)
    return AlterPlan(
        state=new_state,
        operation=operation,
        parameters=parameters,
        checks=tuple(work.checks),
        new_not_null=tuple(work.new_not_null),
        changed=metadata_changed or protocol != state.protocol or bool(work.domains),
        protocol_changed=protocol != state.protocol,
        metadata_changed=metadata_changed,
        domains=tuple(work.domains),
    )


def _apply(work: Work, change: Change) -> None:
    op = change.get("op")
    handler = _HANDLERS.get(str(op))
    if handler is None:
        raise UnsupportedFeatureError(
            f"ALTER TABLE {work.state.label}: {change.get('text') or op} is not supported by"
            " deltaflow. Supported: ADD/DROP/RENAME COLUMN, ALTER COLUMN TYPE / COMMENT /"
            " FIRST|AFTER / SET|DROP NOT NULL, SET/UNSET TBLPROPERTIES, ADD/DROP CONSTRAINT."
            " See docs/sql.md.",
            table_uri=work.state.uri,
            feature=str(change.get("feature") or op),
        )
    handler(work, change)


_HANDLERS = {
    "addColumn": columns.add_column,
    "renameColumn": columns.rename_column,
    "dropColumn": columns.drop_column,
    "updateColumnType": columns.update_type,
    "updateColumnNullability": columns.update_nullability,
    "updateColumnComment": columns.update_comment,
    "updateColumnPosition": columns.update_position,
    "updateColumnDefault": columns.update_default,
    "clusterBy": columns.cluster_by,
    "setProperty": properties.set_property,
    "removeProperty": properties.remove_property,
    "addConstraint": properties.add_constraint,
    "dropConstraint": properties.drop_constraint,
}
