"""``DeltaTable.dropFeatureSupport``: drop a writer feature, or refuse naming why.

deltaflow drops the removable writer-only features it knows (``checkConstraints``) when
the table no longer uses them: one commit of the normalized protocol (the weakest form
that still has the other features, e.g. writer 3 -> writer 2), operation ``DROP
FEATURE``, as delta-spark. Everything else is refused with the case delta-spark would
report: an unknown feature, one the table does not have, one no Delta client can drop,
one still in use, or a reader-writer feature (delta-spark purges its traces and
truncates history, which deltaflow does not do yet).
"""

from __future__ import annotations

from deltaflow.errors import DeltaflowError, InvalidOptionError
from deltaflow.table import _log_commit
from deltaflow.table._protocol import (
    ADDABLE_FEATURES,
    READER_WRITER_FEATURES,
    Protocol,
    features_in_use,
)
from deltaflow.table._snapshot import Snapshot
from deltaflow.table.errors import UnsupportedFeatureError

# Legacy features delta-spark cannot drop either (DELTA_FEATURE_DROP_NONREMOVABLE_FEATURE).
_NON_REMOVABLE = frozenset(
    {"appendOnly", "invariants", "changeDataFeed", "generatedColumns", "identityColumns"}
)
# Table features the Delta protocol names (PROTOCOL.md), beyond the ones above.
_KNOWN = frozenset(
    {
        *ADDABLE_FEATURES,
        *READER_WRITER_FEATURES,
        *_NON_REMOVABLE,
        "allowColumnDefaults",
        "checkpointProtection",
        "clustering",
        "domainMetadata",
        "icebergCompatV1",
        "icebergCompatV2",
        "inCommitTimestamp",
        "rowTracking",
    }
)


# Writer-only features delta-spark can drop that deltaflow drops too.
_DROPPABLE = frozenset({"checkConstraints"})
# The features each legacy protocol (reader, writer) has: the weakest forms to normalize to.
_LEGACY_FORMS: tuple[tuple[tuple[int, int], frozenset[str]], ...] = (
    ((1, 1), frozenset()),
    ((1, 2), frozenset({"appendOnly", "invariants"})),
    ((1, 3), frozenset({"appendOnly", "invariants", "checkConstraints"})),
    (
        (1, 4),
        frozenset(
            {"appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns"}
        ),
    ),
)


def drop_feature(snapshot: Snapshot, name: str, truncate_history: bool | None, label: str) -> int:
    """Drop ``name`` from the table's protocol in one commit (the version), or raise."""
    canonical = {f.lower(): f for f in _KNOWN}.get(name.lower())
    present = _protocol_features(snapshot)
    if canonical not in _DROPPABLE or canonical not in present or _in_use(snapshot, canonical):
        raise drop_refusal(snapshot, name, label)
    if truncate_history:
        raise InvalidOptionError(
            f"dropFeatureSupport({canonical!r}, truncateHistory=True) on {label}:"
            f" {canonical} is a writer feature, whose drop needs no history truncation"
            " (delta-spark refuses it too). Call dropFeatureSupport without truncateHistory.",
            option="truncateHistory",
        )
    _log_commit.require_conditional_put(snapshot.uri, f"dropFeatureSupport({canonical!r})")
    protocol = _normalized(present - {canonical})
    return _log_commit.commit(
        _log_commit.LogCommitRequest(
            table_uri=snapshot.uri,
            read_version=snapshot.version,
            operation="DROP FEATURE",
            operation_parameters={"featureName": canonical, "truncateHistory": "false"},
            protocol=protocol.to_action(),
            partitioned=bool(snapshot.partition_columns),
            checkpoint_interval=_log_commit.checkpoint_interval(snapshot.configuration),
        )
    )


def _normalized(features: frozenset[str]) -> Protocol:
    """The weakest protocol with exactly ``features``: a legacy one when they are one
    legacy version's set, else table features (reader 3 only for reader-writer ones)."""
    for (reader, writer), implied in _LEGACY_FORMS:
        if features == implied:
            return Protocol(reader, writer)
    reader_features = features & READER_WRITER_FEATURES
    if reader_features:
        return Protocol(3, 7, reader_features, features)
    return Protocol(1, 7, frozenset(), features)


def drop_refusal(snapshot: Snapshot, name: str, label: str) -> DeltaflowError:
    """The error ``dropFeatureSupport(name)`` raises on ``snapshot``'s table when it
    cannot drop ``name``."""
    canonical = {f.lower(): f for f in _KNOWN}.get(name.lower())
    if canonical is None:
        return InvalidOptionError(
            f"dropFeatureSupport({name!r}) on {label}: {name!r} is not a Delta table feature."
            f" Known features: {', '.join(sorted(_KNOWN))}.",
            option="featureName",
            valid=tuple(sorted(_KNOWN)),
        )
    present = _protocol_features(snapshot)
    if canonical not in present:
        return InvalidOptionError(
            f"dropFeatureSupport({canonical!r}) on {label}: the table's protocol does not"
            f" have {canonical} (it has: {', '.join(sorted(present)) or 'no features'}),"
            " so there is nothing to drop.",
            option="featureName",
            valid=tuple(sorted(present)),
        )
    if canonical in _NON_REMOVABLE:
        return UnsupportedFeatureError(
            f"dropFeatureSupport({canonical!r}) on {label}: {canonical} is a legacy feature"
            " that no Delta client can drop (delta-spark refuses it too). To be rid of it,"
            f" copy the table: CREATE TABLE <new> USING delta AS SELECT * FROM {label}.",
            table_uri=snapshot.uri,
            feature=canonical,
        )
    in_use = _in_use(snapshot, canonical)
    if in_use and canonical in _DROPPABLE:
        return UnsupportedFeatureError(
            f"dropFeatureSupport({canonical!r}) on {label}: the table still uses"
            f" {canonical} ({in_use}). Remove that first, then drop the feature; nothing was"
            " changed.",
            table_uri=snapshot.uri,
            feature=canonical,
        )
    how = (
        f" The table still uses it ({in_use}); remove that first, then drop the feature with"
        f" a Delta client that supports ALTER TABLE {label} DROP FEATURE {canonical}"
        if in_use
        else f" Drop it with a Delta client that supports ALTER TABLE {label} DROP FEATURE"
        f" {canonical}"
    )
    return UnsupportedFeatureError(
        f"dropFeatureSupport({canonical!r}) on {label}: deltaflow cannot drop table features"
        f" yet; nothing was changed.{how} (delta-spark 3.4+), or copy the table without it:"
        f" CREATE TABLE <new> USING delta AS SELECT * FROM {label}.",
        table_uri=snapshot.uri,
        feature="dropFeature",
    )


def _protocol_features(snapshot: Snapshot) -> frozenset[str]:
    return Protocol(
        snapshot.min_reader_version,
        snapshot.min_writer_version,
        frozenset(snapshot.reader_features),
        frozenset(snapshot.writer_features),
    ).features


def _in_use(snapshot: Snapshot, feature: str) -> str | None:
    if feature == "deletionVectors" and snapshot.deleted_rows():
        return "some files have deletion vectors: OPTIMIZE rewrites them"
    if feature == "checkConstraints" and feature in features_in_use(
        snapshot.configuration, snapshot.schema
    ):
        return "CHECK constraints: ALTER TABLE ... DROP CONSTRAINT <name>"
    if feature == "columnMapping" and snapshot.column_mapping_mode != "none":
        return f"delta.columnMapping.mode is '{snapshot.column_mapping_mode}'"
    return None
