"""ALTER TABLE rules for table properties, the protocol and CHECK constraints (see
:mod:`._alter`)."""

from __future__ import annotations

import json
import re

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _constraints
from deltaflow.table._alter_columns import enable_column_mapping
from deltaflow.table._alter_state import Change, TableState, Work
from deltaflow.table._protocol import (
    ADDABLE_FEATURES,
    CHECKPOINT_POLICY,
    KNOWN_FEATURES,
    READER_WRITER_FEATURES,
    Protocol,
)
from deltaflow.table.errors import (
    InvalidConstraintError,
    UnsupportedFeatureError,
)

_BOOLEAN_PROPERTIES = (
    "delta.appendOnly",
    "delta.enableChangeDataFeed",
    "delta.enableDeletionVectors",
    "delta.enableTypeWidening",
)
# Properties that turn on a feature deltaflow's writers do not implement.
_UNWRITABLE_WHEN_TRUE = {
    "delta.enableRowTracking": "rowTracking",
    "delta.enableInCommitTimestamps": "inCommitTimestamp",
}
_FEATURE_OF_PROPERTY = {
    "delta.appendOnly": "appendOnly",
    "delta.enableChangeDataFeed": "changeDataFeed",
    "delta.enableDeletionVectors": "deletionVectors",
    "delta.enableTypeWidening": "typeWidening",
}
# delta-spark's operation name for each kind of change.

# ---- properties -------------------------------------------------------------------------


def set_property(work: Work, change: Change) -> None:
    key, value = str(change["key"]), str(change["value"])
    lowered = key.lower()
    settings = json.loads(work.parameters.get("properties", "{}"))
    settings[key] = value
    work.parameters["properties"] = json.dumps(settings)
    if lowered == "comment":
        work.description = value
        return
    if lowered.startswith(_constraints.CONSTRAINT_PREFIX):
        raise _constraint_property(work, key)
    if lowered.startswith("delta.feature."):
        _support_feature(work, key[len("delta.feature.") :], value)
        return
    if lowered in ("delta.minreaderversion", "delta.minwriterversion"):
        _raise_version(work, lowered, value)
        return
    if key in _BOOLEAN_PROPERTIES and value.lower() not in ("true", "false"):
        raise InvalidOptionError(
            f"ALTER TABLE {work.state.label}: {key} must be 'true' or 'false', not {value!r}.",
            option=key,
            valid=("true", "false"),
        )
    if key in _UNWRITABLE_WHEN_TRUE and value.lower() == "true":
        raise _unwritable(work, _UNWRITABLE_WHEN_TRUE[key], key)
    if key == "delta.columnMapping.mode":
        enable_column_mapping(work, value.lower())
        return
    if key == "delta.columnMapping.maxColumnId":
        raise InvalidOptionError(
            f"ALTER TABLE {work.state.label}: delta.columnMapping.maxColumnId is maintained by"
            " Delta itself and cannot be set.",
            option=key,
        )
    if key in _FEATURE_OF_PROPERTY and value.lower() == "true":
        work.features.add(_FEATURE_OF_PROPERTY[key])
    if key == CHECKPOINT_POLICY and value.lower() == "v2":
        work.features.add("v2Checkpoint")  # delta-spark's upgrade; 'classic' keeps it
    work.configuration[key] = value


def _constraint_property(work: Work, key: str) -> InvalidOptionError:
    return InvalidOptionError(
        f"ALTER TABLE {work.state.label}: {key} is a CHECK constraint; change constraints with"
        " ALTER TABLE ... ADD CONSTRAINT name CHECK (expr) and DROP CONSTRAINT name, which"
        " check the existing rows.",
        option=key,
    )


def _unwritable(work: Work, feature: str, key: str) -> UnsupportedFeatureError:
    return UnsupportedFeatureError(
        f"ALTER TABLE {work.state.label}: {key} turns on the Delta feature '{feature}', which"
        " deltaflow's writers do not implement; enabling it would let them write the table"
        f" wrongly. Features deltaflow can add: {', '.join(ADDABLE_FEATURES)}.",
        table_uri=work.state.uri,
        feature=feature,
    )


def _support_feature(work: Work, name: str, value: str) -> None:
    if value.lower() not in ("supported", "enabled"):
        raise InvalidOptionError(
            f"ALTER TABLE {work.state.label}: delta.feature.{name} takes 'supported', not"
            f" {value!r} (removing a feature is ALTER TABLE ... DROP FEATURE, which deltaflow"
            " does not support).",
            option=f"delta.feature.{name}",
            valid=("supported",),
        )
    canonical = {f.lower(): f for f in ADDABLE_FEATURES}.get(name.lower())
    if canonical is None and name.lower() not in {f.lower() for f in KNOWN_FEATURES}:
        # Not a Delta feature at all: delta-spark's DELTA_UNSUPPORTED_FEATURES_IN_CONFIG.
        raise UnsupportedFeatureError(
            "[DELTA_UNSUPPORTED_FEATURES_IN_CONFIG] Table features configured in the"
            " following Spark configs or Delta table properties are not recognized by this"
            f" version of Delta Lake: delta.feature.{name}. ALTER TABLE {work.state.label}:"
            f" check the name; features deltaflow can add: {', '.join(ADDABLE_FEATURES)}.",
            table_uri=work.state.uri,
            feature=name,
        )
    if canonical is None:
        raise _unwritable(work, name, f"delta.feature.{name}")
    work.features.add(canonical)


def _raise_version(work: Work, key: str, value: str) -> None:
    reader = key == "delta.minreaderversion"
    limit = 3 if reader else 7
    try:
        wanted = int(value)
    except ValueError:
        wanted = -1
    if not 1 <= wanted <= limit:
        raise InvalidOptionError(
            f"ALTER TABLE {work.state.label}: {key} must be a protocol version from 1 to"
            f" {limit}, not {value!r}.",
            option=key,
        )
    current = work.state.protocol.reader if reader else work.state.protocol.writer
    if wanted < current:
        raise InvalidOptionError(
            f"ALTER TABLE {work.state.label}: the protocol cannot go down ({key} is {current},"
            f" {wanted} was asked). Protocol versions only go up.",
            option=key,
        )
    r, w = work.minimum
    work.minimum = (max(r, wanted), w) if reader else (r, max(w, wanted))


def raised_to(protocol: Protocol, minimum: tuple[int, int], state: TableState) -> Protocol:
    reader, writer = minimum
    if reader <= protocol.reader and writer <= protocol.writer:
        return protocol
    if reader >= 3 or writer >= 7:
        # Table features: the protocol lists what it had, implied or explicit.
        features = protocol.features
        writer_features = frozenset(features)
        reader_features = features & READER_WRITER_FEATURES
        if reader >= 3 or protocol.reader >= 3:
            return Protocol(3, 7, reader_features | protocol.reader_features, writer_features)
        return Protocol(max(protocol.reader, reader), 7, frozenset(), writer_features)
    if reader >= 2 and max(writer, protocol.writer) < 5:
        raise InvalidOptionError(
            f"ALTER TABLE {state.label}: reader version 2 needs writer version 5 or more.",
            option="delta.minReaderVersion",
        )
    return Protocol(max(reader, protocol.reader), max(writer, protocol.writer))


def remove_property(work: Work, change: Change) -> None:
    key = str(change["key"])
    lowered = key.lower()
    removed = json.loads(work.parameters.get("properties", "[]"))
    removed.append(key)
    work.parameters["properties"] = json.dumps(removed)
    work.parameters.setdefault("ifExists", bool(change.get("ifExists", True)))
    if lowered == "comment":
        work.description = None
        return
    if lowered.startswith(_constraints.CONSTRAINT_PREFIX):
        raise _constraint_property(work, key)
    if lowered == "delta.columnmapping.mode" and work.mapped:
        raise UnsupportedFeatureError(
            f"ALTER TABLE {work.state.label}: column mapping cannot be removed in place (data"
            " files name columns by physical names). Rewrite the table into a new one.",
            table_uri=work.state.uri,
            feature="columnMapping",
        )
    if lowered.startswith("delta.feature.") or lowered in (
        "delta.minreaderversion",
        "delta.minwriterversion",
    ):
        raise UnsupportedFeatureError(
            f"ALTER TABLE {work.state.label} UNSET TBLPROPERTIES ({key}): protocol versions and"
            " features cannot be removed (that is DROP FEATURE, which deltaflow does not"
            " support).",
            table_uri=work.state.uri,
            feature="dropFeature",
        )
    match = next((k for k in work.configuration if k.lower() == lowered), None)
    if match is None:
        if not change.get("ifExists", True):
            raise InvalidOptionError(
                f"ALTER TABLE {work.state.label} UNSET TBLPROPERTIES: the table has no property"
                f" {key}. Use UNSET TBLPROPERTIES IF EXISTS to ignore missing ones.",
                option=key,
            )
        return
    del work.configuration[match]


# ---- constraints ------------------------------------------------------------------------


def add_constraint(work: Work, change: Change) -> None:
    name = str(change["name"])
    expression = str(change["expression"]).strip()
    if change.get("kind", "check") != "check":
        raise UnsupportedFeatureError(
            f"ALTER TABLE {work.state.label} ADD CONSTRAINT {name}: {change.get('kind')}"
            " constraints are not supported by Delta; only CHECK constraints are. Use ADD"
            " CONSTRAINT name CHECK (expression).",
            table_uri=work.state.uri,
            feature="constraints",
        )
    if not expression or not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise InvalidConstraintError(
            f"ALTER TABLE {work.state.label} ADD CONSTRAINT {name!r}: a constraint needs a name"
            " of letters, digits and underscores and a CHECK expression.",
            table_uri=work.state.uri,
            constraint=name,
            expression=expression,
        )
    existing = _constraints.check_constraints(work.configuration)
    if name.lower() in {n.lower() for n in existing}:
        raise InvalidConstraintError(
            f"ALTER TABLE {work.state.label}: constraint {name} already exists"
            f" (CHECK ({existing[next(n for n in existing if n.lower() == name.lower())]}))."
            " Drop it first or choose another name.",
            table_uri=work.state.uri,
            constraint=name,
            expression=expression,
        )
    work.configuration[_constraints.CONSTRAINT_PREFIX + name.lower()] = expression
    work.features.add("checkConstraints")
    work.checks.append(_constraints.constraint_check(name.lower(), expression, work.schema))
    work.parameters.update({"name": name.lower(), "expr": expression})


def drop_constraint(work: Work, change: Change) -> None:
    name = str(change["name"])
    key = next(
        (
            k
            for k in work.configuration
            if k.lower() == (_constraints.CONSTRAINT_PREFIX + name).lower()
        ),
        None,
    )
    if key is None:
        existing = _constraints.check_constraints(work.configuration)
        if not change.get("ifExists"):
            raise InvalidConstraintError(
                f"ALTER TABLE {work.state.label} DROP CONSTRAINT {name}: the table has no such"
                f" constraint (constraints: {', '.join(existing) or 'none'})."
                " Use DROP CONSTRAINT IF EXISTS to ignore a missing one.",
                table_uri=work.state.uri,
                constraint=name,
                expression="",
            )
        work.parameters.update({"name": name.lower(), "existed": "false"})
        return
    expression = work.configuration.pop(key)
    work.parameters.update({"name": name.lower(), "expr": expression, "existed": "true"})
