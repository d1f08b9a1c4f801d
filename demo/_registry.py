"""Stage 3 of the demo: the device registry, a dimension table kept with MERGE.

One row per tracker: ``device_id``, ``owner``, ``state``, ``firmware``. It is created with
``DeltaTable.create(spark)`` and ``delta.enableChangeDataFeed=true``, filled by a first
MERGE (every device is new: inserts), then updated by a second MERGE that carries a
firmware roll-out wave, a few owners who moved to another state, some devices whose row
did not change, and a few newly registered devices. The change data feed from the second
MERGE's version shows exactly what changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from demo._checks import check

from deltaflow.testing import STATES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FIRMWARE_OLD = ("3.0.4", "3.1.0", "3.1.2")
FIRMWARE_NEW = "3.2.0"
UPGRADE_EVERY = 4  # one device in four gets the new firmware in the second round
MOVES = 5  # owners who moved to another state
NEW_DEVICES = 3
REGISTRY_COLUMNS = ("device_id", "owner", "state", "firmware")


@dataclass(frozen=True)
class RegistryRounds:
    first: pa.Table  # every device, as first registered
    second: pa.Table  # the second round's source rows (changed, unchanged and new)
    changed: frozenset[str]  # devices whose row the second round changes
    inserted: frozenset[str]  # devices the second round adds


def registry_rounds(events: pa.Table) -> RegistryRounds:
    """Both rounds, derived from events: each device's owner and state as first seen."""
    first_seen = (
        events.select(["device_id", "user_id", "state"])
        .group_by("device_id", use_threads=False)
        .aggregate([("user_id", "first"), ("state", "first")])
        .sort_by("device_id")
    )
    devices = first_seen["device_id"].to_pylist()
    owners = first_seen["user_id_first"].to_pylist()
    states = first_seen["state_first"].to_pylist()
    firmware = [FIRMWARE_OLD[i % len(FIRMWARE_OLD)] for i in range(len(devices))]
    first = _table(devices, owners, states, firmware)

    codes = [state.code for state in STATES]
    rows: dict[str, tuple[str, str, str]] = {}
    for i, device in enumerate(devices):
        if i % UPGRADE_EVERY == 0:
            rows[device] = (owners[i], states[i], FIRMWARE_NEW)
        elif i % UPGRADE_EVERY == 1:  # sent again, unchanged: the MERGE must leave it alone
            rows[device] = (owners[i], states[i], firmware[i])
    for i in range(1, 1 + MOVES * 2, 2):
        if i >= len(devices):
            break
        moved_to = codes[(codes.index(states[i]) + 1) % len(codes)]
        rows[devices[i]] = (owners[i], moved_to, firmware[i])  # odd i: not upgraded
    width = len(devices[0]) - len("dev-") if devices else 6
    new = [f"dev-{n:0{width}d}" for n in range(len(devices), len(devices) + NEW_DEVICES)]
    for n, device in enumerate(new):
        rows[device] = (f"usr-new-{n}", codes[n % len(codes)], FIRMWARE_NEW)
    before = dict(zip(devices, zip(owners, states, firmware, strict=True), strict=True))
    changed = frozenset(d for d, row in rows.items() if d in before and before[d] != row)
    ordered = sorted(rows)
    second = _table(
        ordered,
        [rows[d][0] for d in ordered],
        [rows[d][1] for d in ordered],
        [rows[d][2] for d in ordered],
    )
    return RegistryRounds(first, second, changed, frozenset(new))


def _table(
    devices: list[str], owners: list[str], states: list[str], firmware: list[str]
) -> pa.Table:
    return pa.table(
        {"device_id": devices, "owner": owners, "state": states, "firmware": firmware},
        schema=pa.schema([(name, pa.string()) for name in REGISTRY_COLUMNS]),
    )


def create_registry(spark: SparkSession, uri: str) -> None:
    from deltaflow import DeltaTable

    (
        DeltaTable.create(spark)
        .location(uri)
        .addColumn("device_id", "STRING", nullable=False, comment="tracker serial")
        .addColumn("owner", "STRING", comment="user id of the wearer")
        .addColumn("state", "STRING", comment="US state the owner lives in")
        .addColumn("firmware", "STRING")
        .property("delta.enableChangeDataFeed", "true")
        .comment("fitness trackers: one row per device")
        .execute()
    )


def merge_round(spark: SparkSession, uri: str, source: pa.Table) -> dict[str, int]:
    """Upsert ``source`` into the registry; returns the MERGE's metrics."""
    from deltaflow import DeltaTable

    updates = spark.createDataFrame(source)
    result = (
        DeltaTable.forPath(spark, uri)
        .alias("t")
        .merge(updates.alias("s"), "t.device_id = s.device_id")
        .whenMatchedUpdate(
            condition="t.owner <> s.owner OR t.state <> s.state OR t.firmware <> s.firmware",
            set={"owner": "s.owner", "state": "s.state", "firmware": "s.firmware"},
        )
        .whenNotMatchedInsert(
            values={
                "device_id": "s.device_id",
                "owner": "s.owner",
                "state": "s.state",
                "firmware": "s.firmware",
            }
        )
        .execute()
        .first()
    )
    return {key: int(value) for key, value in result.asDict().items()}


def change_counts(changes: pa.Table) -> dict[str, int]:
    counts = changes.group_by("_change_type").aggregate([([], "count_all")])
    return {row["_change_type"]: int(row["count_all"]) for row in counts.to_pylist()}


def firmware_counts(table: pa.Table) -> dict[str, int]:
    counts = table.group_by("firmware").aggregate([([], "count_all")])
    return {row["firmware"]: int(row["count_all"]) for row in counts.to_pylist()}


def devices_in(table: pa.Table, column: str, value: str) -> int:
    return int(pc.sum(pc.equal(table[column], value).cast(pa.int64())).as_py() or 0)


def run_registry(spark: SparkSession, tables_root: str, backfill_uri: str) -> RegistryResult:
    """Create the registry, MERGE both rounds, show and check the second round's changes."""
    import deltalake

    uri = f"{tables_root}/dims/device_registry"
    events = deltalake.DeltaTable(backfill_uri).to_pyarrow_table(
        columns=["device_id", "user_id", "state", "event_time"]
    )
    rounds = registry_rounds(events.sort_by("event_time"))
    print("\nDevice registry (dims/device_registry, delta.enableChangeDataFeed=true)")
    create_registry(spark, uri)
    first = merge_round(spark, uri, rounds.first)
    print(
        f"  round 1 MERGE: {first['num_inserted_rows']:,} devices inserted "
        f"(firmware {', '.join(FIRMWARE_OLD)})"
    )
    second = merge_round(spark, uri, rounds.second)
    moved = len(rounds.changed) - _upgraded_only(rounds)
    print(
        f"  round 2 MERGE of {rounds.second.num_rows:,} rows (firmware {FIRMWARE_NEW} wave, "
        f"{moved} owners moved, {NEW_DEVICES} new devices, the rest unchanged): "
        f"{second['num_updated_rows']:,} updated, {second['num_inserted_rows']:,} inserted"
    )
    version = deltalake.DeltaTable(uri).version()
    changes_df = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", version)
        .load(uri)
    )
    changes = changes_df.toArrow()
    counts = change_counts(changes)
    print(
        f'  spark.read.format("delta").option("readChangeFeed", "true")'
        f'.option("startingVersion", {version})'
    )
    for change_type in ("update_preimage", "update_postimage", "insert", "delete"):
        print(f"  {change_type + ' rows':<26} {counts.get(change_type, 0):>10,}")
    print(f"  Changed devices:           {len(rounds.changed):>10,}")
    print(f"  New devices:               {len(rounds.inserted):>10,}")
    _print_moves(changes)
    registry = deltalake.DeltaTable(uri).to_pyarrow_table()
    print(f"  Registry devices:          {registry.num_rows:>10,}")
    print(
        "  firmware now: "
        + ", ".join(f"{fw} {n:,}" for fw, n in sorted(firmware_counts(registry).items()))
    )
    expected = {
        "update_preimage": len(rounds.changed),
        "update_postimage": len(rounds.changed),
        "insert": len(rounds.inserted),
    }
    check(
        counts == expected,
        f"the change feed of version {version} holds {counts}, expected {expected}",
    )
    post = changes.filter(pc.equal(changes["_change_type"], "update_postimage"))
    check(
        set(post["device_id"].to_pylist()) == rounds.changed,
        "the change feed's updated devices are not the ones the second round changed",
    )
    check(
        registry.num_rows == rounds.first.num_rows + len(rounds.inserted)
        and second["num_updated_rows"] == len(rounds.changed),
        f"registry holds {registry.num_rows:,} devices and the MERGE updated "
        f"{second['num_updated_rows']:,}; expected {rounds.first.num_rows + NEW_DEVICES:,} "
        f"and {len(rounds.changed):,}",
    )
    print("  OK: the change feed shows exactly the devices the second round changed or added")
    return RegistryResult(uri, version, counts, len(rounds.changed), registry.num_rows)


@dataclass(frozen=True)
class RegistryResult:
    uri: str
    version: int
    change_counts: dict[str, int]
    changed: int
    devices: int


def _upgraded_only(rounds: RegistryRounds) -> int:
    before = dict(
        zip(rounds.first["device_id"].to_pylist(), rounds.first["state"].to_pylist(), strict=True)
    )
    after = dict(
        zip(rounds.second["device_id"].to_pylist(), rounds.second["state"].to_pylist(), strict=True)
    )
    return sum(1 for device in rounds.changed if before[device] == after[device])


def _print_moves(changes: pa.Table) -> None:
    """The owners who moved: pre- and post-image side by side."""
    images: dict[str, dict[str, dict[str, str]]] = {}
    for row in changes.to_pylist():
        if row["_change_type"].startswith("update_"):
            images.setdefault(row["device_id"], {})[row["_change_type"]] = row
    moves = [
        (device, pair["update_preimage"], pair["update_postimage"])
        for device, pair in sorted(images.items())
        if pair["update_preimage"]["state"] != pair["update_postimage"]["state"]
    ]
    for device, before, after in moves:
        print(
            f"    {device} ({before['owner']}): {before['state']} -> {after['state']}, "
            f"firmware {before['firmware']} -> {after['firmware']}"
        )
