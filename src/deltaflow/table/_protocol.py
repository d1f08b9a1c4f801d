"""The Delta protocol action: which features a table needs, and minimal upgrades.

A legacy protocol (writer version < 7) implies its features by version; a table-features
protocol (reader 3 / writer 7) lists them. :meth:`Protocol.with_features` gives the
lowest protocol that adds features to a table's: a legacy version bump when the
feature has one (``checkConstraints`` -> writer 3, ``changeDataFeed`` -> writer 4,
``columnMapping`` -> reader 2 / writer 5), else table features listing the features the
table actually uses plus the new ones, as delta-spark's upgrades do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Features each legacy writer version brought (cumulative by version).
_LEGACY_WRITER = {
    2: ("appendOnly", "invariants"),
    3: ("checkConstraints",),
    4: ("changeDataFeed", "generatedColumns"),
    5: ("columnMapping",),
    6: ("identityColumns",),
}
# Features that readers must understand too (listed in readerFeatures).
READER_WRITER_FEATURES = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "typeWidening",
        "typeWidening-preview",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "variantType",
        "variantType-preview",
    }
)
# Features deltaflow's writers honour, so an ALTER may add them.
ADDABLE_FEATURES = (
    "appendOnly",
    "changeDataFeed",
    "checkConstraints",
    "columnMapping",
    "deletionVectors",
    "invariants",
    "timestampNtz",
    # Commits go through deltaflow's log writer (delta-rs 1.6 refuses them); reads cast
    # each file's columns to the table's type.
    "typeWidening",
    # delta-rs 1.6 writes V2-spec checkpoints (a checkpointMetadata action, classic-named)
    # on tables that have it; see table/_log_upkeep.py.
    "v2Checkpoint",
    "vacuumProtocolCheck",
)
# Every table feature the Delta protocol names (delta-spark 4.4's list, test-only features
# aside): a `delta.feature.<name>` outside it is not a feature at all.
KNOWN_FEATURES = frozenset(
    {
        "allowColumnDefaults",
        "appendOnly",
        "catalogManaged",
        "catalogOwned-preview",
        "changeDataFeed",
        "checkConstraints",
        "checkpointProtection",
        "clustering",
        "collations-preview",
        "columnMapping",
        "coordinatedCommits-preview",
        "deletionVectors",
        "domainMetadata",
        "generatedColumns",
        "geospatial",
        "icebergCompatV1",
        "icebergCompatV2",
        "icebergCompatV3",
        "icebergWriterCompatV1",
        "icebergWriterCompatV3",
        "identityColumns",
        "inCommitTimestamp",
        "invariants",
        "materializePartitionColumns",
        "rowTracking",
        "timestampNtz",
        "typeWidening",
        "typeWidening-preview",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "variantShredding-preview",
        "variantType",
        "variantType-preview",
    }
)
# Writer features delta-rs 1.6 refuses to commit to ("Unsupported table features
# required"): every commit to such a table goes through deltaflow's log writer
# (table/_log_write.py). identityColumns is also implied by a legacy writer version 6.
DELTA_RS_UNWRITABLE_FEATURES = frozenset(
    {
        "clustering",
        "domainMetadata",
        "identityColumns",
        "typeWidening",
        "typeWidening-preview",
    }
)
# The table property that asks for V2 checkpoints ('v2'; 'classic' is the default), and so
# for the v2Checkpoint feature (reader 3 / writer 7), as in delta-spark.
CHECKPOINT_POLICY = "delta.checkpointPolicy"
CHECKPOINT_POLICIES = ("classic", "v2")
# Features whose new tables delta-rs 1.6 gives a wrong protocol (protocol_for_new_table).
_DELTA_RS_CREATES_WRONGLY = frozenset({"deletionVectors", "v2Checkpoint"})


@dataclass(frozen=True)
class Protocol:
    reader: int
    writer: int
    reader_features: frozenset[str] = frozenset()
    writer_features: frozenset[str] = frozenset()

    @classmethod
    def of(cls, table: Any) -> Protocol:
        """The protocol of anything with ``min_reader_version``, ``min_writer_version``,
        ``reader_features`` and ``writer_features`` (a Snapshot, delta-rs's protocol)."""
        return cls(
            table.min_reader_version,
            table.min_writer_version,
            frozenset(table.reader_features or ()),
            frozenset(table.writer_features or ()),
        )

    @property
    def delta_rs_unwritable(self) -> frozenset[str]:
        """The features of this protocol that make delta-rs 1.6 refuse to commit."""
        return self.features & DELTA_RS_UNWRITABLE_FEATURES

    @property
    def features(self) -> frozenset[str]:
        """Every feature the protocol supports (implied by legacy versions or listed)."""
        found = set(self.reader_features) | set(self.writer_features)
        if self.writer < 7:
            for version, implied in _LEGACY_WRITER.items():
                if self.writer >= version:
                    found.update(implied)
        if self.reader == 2:
            found.add("columnMapping")
        return frozenset(found)

    def with_features(self, added: Iterable[str], used: Iterable[str] = ()) -> Protocol:
        """The lowest protocol supporting this one's features and ``added``. ``used``: the
        features the table's metadata uses, kept when a legacy protocol turns into a
        table-features one (the legacy versions' other implied features are dropped)."""
        new = set(added) - self.features
        if "typeWidening-preview" in self.features:  # a table delta-spark 3.x widened
            new.discard("typeWidening")
        if not new:
            return self
        if self.writer < 7 and all(_legacy_version(f) is not None for f in new):
            writer = max([self.writer, *(_legacy_version(f) or 0 for f in new)])
            reader = max(self.reader, 2 if "columnMapping" in new else 1)
            return Protocol(reader, writer)
        if self.writer < 7:
            kept = {"appendOnly", "invariants"} if self.writer >= 2 else set()
            kept |= set(used) & self.features
            if self.reader >= 2:
                kept.add("columnMapping")
            writer_features = frozenset(kept | new)
        else:
            writer_features = frozenset(self.writer_features | new)
        reader_needs = writer_features & READER_WRITER_FEATURES
        if reader_needs or self.reader >= 3:
            listed = self.reader_features if self.reader >= 3 else frozenset()
            return Protocol(3, 7, frozenset(listed | reader_needs), writer_features)
        return Protocol(self.reader, 7, frozenset(), writer_features)

    def to_action(self) -> dict[str, Any]:
        action: dict[str, Any] = {"minReaderVersion": self.reader, "minWriterVersion": self.writer}
        if self.reader >= 3:
            action["readerFeatures"] = sorted(self.reader_features)
        if self.writer >= 7:
            action["writerFeatures"] = sorted(self.writer_features)
        return action


def _legacy_version(feature: str) -> int | None:
    for version, implied in _LEGACY_WRITER.items():
        if feature in implied:
            return version
    return None


def features_in_use(
    configuration: Mapping[str, str | None], schema: Mapping[str, Any]
) -> frozenset[str]:
    """The features a table's metadata makes use of (kept across a protocol upgrade)."""
    used = set()
    lowered = {k.lower(): (v or "") for k, v in configuration.items()}
    if lowered.get("delta.appendonly", "").lower() == "true":
        used.add("appendOnly")
    if any(k.startswith("delta.constraints.") for k in lowered):
        used.add("checkConstraints")
    if lowered.get("delta.enablechangedatafeed", "").lower() == "true":
        used.add("changeDataFeed")
    if lowered.get("delta.columnmapping.mode", "none").lower() != "none":
        used.add("columnMapping")
    text = repr(schema)
    if "delta.generationExpression" in text:
        used.add("generatedColumns")
    if "delta.identity." in text:
        used.add("identityColumns")
    if "delta.invariants" in text:
        used.add("invariants")
    if lowered.get("delta.enabledeletionvectors", "").lower() == "true":
        used.add("deletionVectors")
    if "'timestamp_ntz'" in text:
        used.add("timestampNtz")
    if "'variant'" in text:
        used.add("variantType")
    if lowered.get("delta.enabletypewidening", "").lower() == "true":
        used.add("typeWidening")
    if lowered.get(CHECKPOINT_POLICY.lower(), "").lower() == "v2":
        used.add("v2Checkpoint")
    return frozenset(used)


def protocol_for_new_table(
    configuration: Mapping[str, str | None], schema: Mapping[str, Any]
) -> Protocol | None:
    """The protocol a new table gets when delta-rs would write a wrong one, else None.

    delta-rs 1.6 lists ``variantType`` (and the legacy ``appendOnly`` / ``invariants``)
    in every table-features protocol it creates, e.g. for ``delta.enableDeletionVectors``,
    and leaves ``delta.checkpointPolicy = 'v2'`` at reader 1 / writer 2 without the
    ``v2Checkpoint`` feature; deltaflow then writes version 0 itself with the features the
    table uses, from :func:`new_table_base`.
    """
    used = features_in_use(configuration, schema)
    if not used & _DELTA_RS_CREATES_WRONGLY:
        return None
    return new_table_base(configuration, schema).with_features(used, used)


def new_table_base(configuration: Mapping[str, str | None], schema: Mapping[str, Any]) -> Protocol:
    """The protocol a new table's features are added to: delta-spark's default (1, 2),
    whose ``appendOnly`` / ``invariants`` stay listed in a table-features protocol (as
    delta-spark lists them for ``v2Checkpoint`` or ``typeWidening``), except with deletion
    vectors, whose tables list exactly the features they use."""
    if "deletionVectors" in features_in_use(configuration, schema):
        return Protocol(1, 1)
    return Protocol(1, 2)
