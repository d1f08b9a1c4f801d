"""ALTER TABLE's log rules (table/_alter*), the protocol upgrades (table/_protocol) and the
row checks (table/_constraints), without Spark."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _constraints
from deltaflow.table._alter import plan_alter
from deltaflow.table._alter_state import TableState
from deltaflow.table._protocol import Protocol, protocol_for_new_table
from deltaflow.table.errors import (
    ConstraintViolationError,
    InvalidConstraintError,
    SchemaMismatchError,
    UnsupportedFeatureError,
)


def field(name: str, type_: Any, nullable: bool = True, **metadata: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, "nullable": nullable, "metadata": metadata}


def state(**overrides: Any) -> TableState:
    base: dict[str, Any] = {
        "uri": "file:///t",
        "label": "t",
        "schema": {
            "type": "struct",
            "fields": [
                field("id", "long"),
                field("p", "string"),
                field("s", {"type": "struct", "fields": [field("a", "integer")]}),
            ],
        },
        "partition_columns": ("p",),
        "configuration": {},
        "protocol": Protocol(1, 2),
    }
    base.update(overrides)
    return TableState(**base)


def mapped() -> TableState:
    plan = plan_alter(
        state(), [{"op": "setProperty", "key": "delta.columnMapping.mode", "value": "name"}]
    )
    return plan.state


# ---- protocol ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "added", "expected"),
    [
        (Protocol(1, 2), {"checkConstraints"}, Protocol(1, 3)),
        (Protocol(1, 2), {"changeDataFeed"}, Protocol(1, 4)),
        (Protocol(1, 2), {"columnMapping"}, Protocol(2, 5)),
        (Protocol(1, 4), {"checkConstraints"}, Protocol(1, 4)),  # already implied
        (
            Protocol(1, 2),
            {"deletionVectors"},
            Protocol(
                3,
                7,
                frozenset({"deletionVectors"}),
                frozenset({"appendOnly", "invariants", "deletionVectors"}),
            ),
        ),
        (
            Protocol(3, 7, frozenset({"deletionVectors"}), frozenset({"deletionVectors"})),
            {"changeDataFeed"},
            Protocol(
                3,
                7,
                frozenset({"deletionVectors"}),
                frozenset({"deletionVectors", "changeDataFeed"}),
            ),
        ),
        (
            Protocol(1, 7, frozenset(), frozenset({"appendOnly"})),
            {"columnMapping"},
            Protocol(
                3, 7, frozenset({"columnMapping"}), frozenset({"appendOnly", "columnMapping"})
            ),
        ),
    ],
)
def test_protocol_upgrades_minimally(start: Protocol, added: set[str], expected: Protocol) -> None:
    assert start.with_features(added) == expected


def test_legacy_features_in_use_survive_a_table_features_upgrade() -> None:
    upgraded = Protocol(1, 4).with_features({"deletionVectors"}, used={"changeDataFeed"})
    assert upgraded.writer_features == {
        "appendOnly",
        "invariants",
        "changeDataFeed",
        "deletionVectors",
    }
    assert "generatedColumns" not in upgraded.writer_features  # implied by 4, not used
    assert upgraded.to_action()["readerFeatures"] == ["deletionVectors"]


# ---- columns -------------------------------------------------------------------------------


def test_add_column_nested_after_and_first() -> None:
    plan = plan_alter(
        state(),
        [
            {"op": "addColumn", "field": ["s", "b"], "type": "string", "position": {"first": True}},
            {"op": "addColumn", "field": ["x"], "type": "varchar(3)", "position": {"after": "id"}},
        ],
    )
    fields = plan.state.schema["fields"]
    assert [f["name"] for f in fields] == ["id", "x", "p", "s"]
    assert fields[1]["type"] == "string"
    assert fields[1]["metadata"]["__CHAR_VARCHAR_TYPE_STRING"] == "varchar(3)"
    assert [f["name"] for f in fields[3]["type"]["fields"]] == ["b", "a"]
    assert plan.operation == "ADD COLUMNS"
    assert [c["column"]["name"] for c in json.loads(plan.parameters["columns"])] == ["s.b", "x"]


def test_add_column_errors() -> None:
    with pytest.raises(SchemaMismatchError):
        plan_alter(state(), [{"op": "addColumn", "field": ["ID"], "type": "long"}])
    with pytest.raises(SchemaMismatchError):
        plan_alter(state(), [{"op": "addColumn", "field": ["nope", "x"], "type": "long"}])
    with pytest.raises(UnsupportedFeatureError):
        plan_alter(
            state(), [{"op": "addColumn", "field": ["x"], "type": "long", "nullable": False}]
        )


def test_column_mapping_upgrade_assigns_ids_and_keeps_physical_names() -> None:
    plan = plan_alter(
        state(), [{"op": "setProperty", "key": "delta.columnMapping.mode", "value": "name"}]
    )
    fields = plan.state.schema["fields"]
    assert [f["metadata"]["delta.columnMapping.id"] for f in fields] == [1, 2, 3]
    assert [f["metadata"]["delta.columnMapping.physicalName"] for f in fields] == ["id", "p", "s"]
    nested = fields[2]["type"]["fields"][0]["metadata"]
    assert nested == {"delta.columnMapping.id": 4, "delta.columnMapping.physicalName": "a"}
    assert plan.state.configuration["delta.columnMapping.maxColumnId"] == "4"
    assert plan.state.protocol == Protocol(2, 5)
    with pytest.raises(UnsupportedFeatureError):
        plan_alter(
            plan.state, [{"op": "setProperty", "key": "delta.columnMapping.mode", "value": "id"}]
        )


def test_rename_keeps_physical_name_and_follows_partitions() -> None:
    plan = plan_alter(mapped(), [{"op": "renameColumn", "field": ["p"], "newName": "part"}])
    renamed = plan.state.schema["fields"][1]
    assert renamed["name"] == "part"
    assert renamed["metadata"]["delta.columnMapping.physicalName"] == "p"
    assert plan.state.partition_columns == ("part",)
    assert plan.parameters == {"oldColumnPath": "p", "newColumnPath": "part"}
    new = plan_alter(mapped(), [{"op": "addColumn", "field": ["z"], "type": "long"}]).state
    assert new.schema["fields"][-1]["metadata"]["delta.columnMapping.physicalName"].startswith(
        "col-"
    )


def test_drop_rules() -> None:
    with pytest.raises(UnsupportedFeatureError) as info:
        plan_alter(state(), [{"op": "dropColumn", "field": ["id"]}])
    assert "delta.columnMapping.mode" in info.value.message
    with pytest.raises(UnsupportedFeatureError):
        plan_alter(mapped(), [{"op": "dropColumn", "field": ["p"]}])  # partition column
    with pytest.raises(SchemaMismatchError):
        plan_alter(mapped(), [{"op": "dropColumn", "field": ["s", "a"]}])  # last field
    plan = plan_alter(mapped(), [{"op": "dropColumn", "field": ["nope"], "ifExists": True}])
    assert not plan.changed
    constrained = plan_alter(
        mapped(), [{"op": "addConstraint", "name": "c", "expression": "`id` > 0"}]
    ).state
    with pytest.raises(InvalidConstraintError):
        plan_alter(constrained, [{"op": "dropColumn", "field": ["id"]}])
    with pytest.raises(InvalidConstraintError):
        plan_alter(constrained, [{"op": "renameColumn", "field": ["id"], "newName": "k"}])


def test_type_changes() -> None:
    change = [{"op": "updateColumnType", "field": ["s", "a"], "type": "long"}]
    with pytest.raises(UnsupportedFeatureError) as info:
        plan_alter(state(), change)
    assert info.value.feature == "typeWidening"
    widening = state(
        configuration={"delta.enableTypeWidening": "true"},
        protocol=Protocol(3, 7, frozenset({"typeWidening"}), frozenset({"typeWidening"})),
    )
    plan = plan_alter(widening, change)
    inner = plan.state.schema["fields"][2]["type"]["fields"][0]
    assert inner["type"] == "long"
    assert inner["metadata"]["delta.typeChanges"] == [{"fromType": "integer", "toType": "long"}]
    for old, new in [("long", "integer"), ("string", "long")]:
        narrowing = state(
            schema={"type": "struct", "fields": [field("id", old)]},
            partition_columns=(),
            configuration={"delta.enableTypeWidening": "true"},
        )
        with pytest.raises(UnsupportedFeatureError):
            plan_alter(narrowing, [{"op": "updateColumnType", "field": ["id"], "type": new}])
    with pytest.raises(UnsupportedFeatureError):  # partition column
        plan_alter(widening, [{"op": "updateColumnType", "field": ["p"], "type": "long"}])
    same = plan_alter(state(), [{"op": "updateColumnType", "field": ["id"], "type": "long"}])
    assert same.operation == "CHANGE COLUMN"


def test_set_not_null_asks_for_a_check_and_position_moves() -> None:
    plan = plan_alter(
        state(), [{"op": "updateColumnNullability", "field": ["S", "A"], "nullable": False}]
    )
    assert plan.new_not_null == (("s", "a"),)
    (check,) = plan.checks
    assert check.holds == "`s` IS NULL OR `s`.`a` IS NOT NULL"
    moved = plan_alter(
        state(), [{"op": "updateColumnPosition", "field": ["s"], "position": {"first": True}}]
    )
    assert [f["name"] for f in moved.state.schema["fields"]] == ["s", "id", "p"]


# ---- properties and constraints ------------------------------------------------------------


def test_properties() -> None:
    plan = plan_alter(
        state(),
        [
            {"op": "setProperty", "key": "delta.enableChangeDataFeed", "value": "true"},
            {"op": "setProperty", "key": "comment", "value": "the table"},
            {"op": "setProperty", "key": "delta.feature.deletionVectors", "value": "supported"},
        ],
    )
    assert plan.state.configuration == {"delta.enableChangeDataFeed": "true"}
    assert plan.state.description == "the table"
    assert plan.state.protocol.reader_features == {"deletionVectors"}
    assert "changeDataFeed" in plan.state.protocol.writer_features
    with pytest.raises(InvalidOptionError):
        plan_alter(state(), [{"op": "removeProperty", "key": "x", "ifExists": False}])
    assert not plan_alter(state(), [{"op": "removeProperty", "key": "x"}]).changed
    with pytest.raises(InvalidOptionError):
        plan_alter(state(), [{"op": "setProperty", "key": "delta.constraints.c", "value": "1"}])
    with pytest.raises(InvalidOptionError):
        plan_alter(state(), [{"op": "setProperty", "key": "delta.appendOnly", "value": "yes"}])
    with pytest.raises(InvalidOptionError):
        plan_alter(
            Protocol_state(3),
            [{"op": "setProperty", "key": "delta.minWriterVersion", "value": "2"}],
        )
    raised = plan_alter(
        state(), [{"op": "setProperty", "key": "delta.minWriterVersion", "value": "4"}]
    )
    assert raised.state.protocol == Protocol(1, 4)
    assert "delta.minWriterVersion" not in raised.state.configuration
    with pytest.raises(UnsupportedFeatureError):
        plan_alter(
            state(), [{"op": "setProperty", "key": "delta.enableRowTracking", "value": "true"}]
        )


@pytest.mark.parametrize(
    ("key", "value", "feature"),
    [
        ("delta.enableTypeWidening", "true", "typeWidening"),
        ("delta.checkpointPolicy", "v2", "v2Checkpoint"),
    ],
)
def test_properties_that_add_a_reader_writer_feature(key: str, value: str, feature: str) -> None:
    """As delta-spark: the property upgrades the protocol to reader 3 / writer 7 with the
    feature in both lists (the legacy writer 2 features kept listed)."""
    plan = plan_alter(state(), [{"op": "setProperty", "key": key, "value": value}])
    assert plan.protocol_changed
    assert plan.state.protocol == Protocol(
        3, 7, frozenset({feature}), frozenset({"appendOnly", "invariants", feature})
    )
    assert plan.state.configuration == {key: value}
    # Set again (or on a table created with it): nothing more to add.
    again = plan_alter(plan.state, [{"op": "setProperty", "key": key, "value": value}])
    assert not again.protocol_changed


def test_a_preview_type_widening_table_keeps_its_feature() -> None:
    preview = Protocol(
        3, 7, frozenset({"typeWidening-preview"}), frozenset({"typeWidening-preview"})
    )
    assert preview.with_features({"typeWidening"}) == preview
    assert protocol_for_new_table({"delta.checkpointPolicy": "classic"}, {}) is None
    # As delta-spark creates it: writer version 2's features stay listed.
    assert protocol_for_new_table({"delta.checkpointPolicy": "V2"}, {}) == Protocol(
        3, 7, frozenset({"v2Checkpoint"}), frozenset({"appendOnly", "invariants", "v2Checkpoint"})
    )


def Protocol_state(writer: int) -> TableState:
    return state(protocol=Protocol(1, writer))


def test_constraints() -> None:
    plan = plan_alter(
        state(), [{"op": "addConstraint", "name": "Pos", "expression": "id > 0 AND s.a < 3"}]
    )
    assert plan.state.configuration == {"delta.constraints.pos": "id > 0 AND s.a < 3"}
    assert plan.state.protocol == Protocol(1, 3)
    (check,) = plan.checks
    assert check.columns == ("id", "s")
    assert plan.parameters == {"name": "pos", "expr": "id > 0 AND s.a < 3"}
    with pytest.raises(InvalidConstraintError):
        plan_alter(plan.state, [{"op": "addConstraint", "name": "POS", "expression": "id > 1"}])
    with pytest.raises(UnsupportedFeatureError):
        plan_alter(
            state(), [{"op": "addConstraint", "name": "u", "kind": "unique", "expression": ""}]
        )
    dropped = plan_alter(plan.state, [{"op": "dropConstraint", "name": "POS"}])
    assert dropped.state.configuration == {}
    assert dropped.parameters["existed"] == "true"
    with pytest.raises(InvalidConstraintError):
        plan_alter(state(), [{"op": "dropConstraint", "name": "nope"}])


# ---- row checks ----------------------------------------------------------------------------


def test_table_checks_and_guard_sql() -> None:
    schema = {
        "type": "struct",
        "fields": [
            field("id", "long", nullable=False),
            field("s", {"type": "struct", "fields": [field("a", "integer", nullable=False)]}),
            field("note", "string"),
        ],
    }
    checks = _constraints.table_checks(schema, {"delta.constraints.c": "id > 'note' OR note = 'x'"})
    assert [(c.kind, c.name) for c in checks] == [
        ("notNull", "id"),
        ("notNull", "s.a"),
        ("check", "c"),
    ]
    assert checks[2].columns == ("id", "note")  # the quoted literal 'note' is not a column
    sql = _constraints.guard_sql(checks, "id")
    assert sql.startswith("CASE WHEN NOT (`id` IS NOT NULL) THEN raise_error(")
    assert sql.endswith("ELSE `id` END")
    error = _constraints.violation_from_text(
        "USER_RAISED_EXCEPTION [deltaflow-check#2]id = 1, note = null[/deltaflow-check] x",
        checks,
        "file:///t",
    )
    assert isinstance(error, ConstraintViolationError)
    assert (error.constraint, error.values, error.columns) == (
        "c",
        "id = 1, note = null",
        ("id", "note"),
    )
    assert _constraints.violation_from_text("other", checks, "file:///t") is None


def test_arrow_checks_find_the_first_violating_row() -> None:
    schema = {"type": "struct", "fields": [field("id", "long"), field("v", "string")]}
    checks = _constraints.table_checks(schema, {"delta.constraints.pos": "id > 0"})
    arrow = pa.schema([("id", pa.int64()), ("v", pa.string())])
    arrow_checks = _constraints.ArrowChecks("file:///t", checks, arrow)
    arrow_checks.check(pa.record_batch([pa.array([1, 2]), pa.array(["a", None])], schema=arrow))
    for bad, shown in (([3, -4], "id = -4"), ([None, 1], "id = null")):  # null breaks it too
        batch = pa.record_batch([pa.array(bad, pa.int64()), pa.array(["a", "b"])], schema=arrow)
        with pytest.raises(ConstraintViolationError) as info:
            arrow_checks.check(batch)
        assert info.value.values == shown
    unreadable = _constraints.table_checks(schema, {"delta.constraints.f": "length(v) > 2"})
    with pytest.raises(UnsupportedFeatureError):
        _constraints.ArrowChecks("file:///t", unreadable, arrow)
