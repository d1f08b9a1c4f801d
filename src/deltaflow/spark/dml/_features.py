"""``DeltaTable.dropFeatureSupport``: the typed refusal, naming why and what to do.

deltaflow does not drop table features yet (delta-spark's ``ALTER TABLE ... DROP
FEATURE`` rewrites or purges what the feature left in the table, and for reader-writer
features truncates history). The checks delta-spark makes first are made here too, so the
error says which case the call is: an unknown feature, one the table does not have, one
no Delta client can drop, or one in use.
"""

from __future__ import annotations

from deltaflow.errors import DeltaflowError, InvalidOptionError
from deltaflow.table._protocol import ADDABLE_FEATURES, READER_WRITER_FEATURES, features_in_use
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


def drop_refusal(snapshot: Snapshot, name: str, label: str) -> DeltaflowError:
    """The error ``dropFeatureSupport(name)`` raises on ``snapshot``'s table."""
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
    from deltaflow.table._protocol import Protocol

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
