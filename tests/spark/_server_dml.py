"""One scenario of Delta SQL for every Spark host: DML on a table with the change data
feed and on one with deletion vectors, the change feed read back, partition overwrites,
DESCRIBE HISTORY / DETAIL, VACUUM, shallow clones (one replacing an emptied table) and
RESTORE, then two bad statements. Each host's test
runs the statements its own way (a classic session, a Connect client, ``spark-sql -e``,
beeline against the Thrift server); the checks read the tables with delta-rs."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder

from deltaflow.errors import from_wire
from deltaflow.spark.dml._merge_native import history_metrics

ROWS = "(1, 'v1'), (2, 'v2'), (3, 'v3'), (4, 'v4'), (5, 'v5')"
# After UPDATE id 1, DELETE id 3 and the MERGE: 2 updated, 6 inserted, 5 deleted by source.
AFTER_DML = [(1, "u"), (2, "two"), (4, "v4"), (6, "six")]
CHANGES = (
    "delete:3 delete:5 insert:6 update_postimage:1 update_postimage:2"
    " update_preimage:1 update_preimage:2"
)
HISTORY = ["RESTORE", "MERGE", "DELETE", "UPDATE", "WRITE", "CREATE TABLE"]
# Version 2 (the static overwrite; 0: CREATE, 1: INSERT), then 3 (the dynamic one).
PARTITIONS_AFTER_STATIC = [(3, 2), (10, 1)]
PARTITIONS_AFTER_DYNAMIC = [(10, 1), (20, 2), (30, 3)]


@dataclass(frozen=True)
class Tables:
    cdf: str  # delta.enableChangeDataFeed
    dv: str  # delta.enableDeletionVectors
    parts: str  # partitioned by p
    clone: str  # a shallow clone of dv

    @classmethod
    def under(cls, root: Path) -> Tables:
        return cls(*(str(root / name) for name in ("cdf", "dv", "parts", "clone")))


def setup(t: Tables) -> list[str]:
    """Create and fill the three tables, and the MERGE source (a temp view)."""
    return [
        f"CREATE TABLE delta.`{t.cdf}` (id BIGINT, v STRING) USING delta"
        " TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",
        f"INSERT INTO delta.`{t.cdf}` VALUES {ROWS}",
        f"CREATE TABLE delta.`{t.dv}` (id BIGINT, v STRING) USING delta"
        " TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
        f"INSERT INTO delta.`{t.dv}` VALUES {ROWS}",
        f"CREATE TABLE delta.`{t.parts}` (id BIGINT, p INT) USING delta PARTITIONED BY (p)",
        f"INSERT INTO delta.`{t.parts}` VALUES (1, 1), (2, 1), (3, 2)",
        "CREATE OR REPLACE TEMPORARY VIEW src AS"
        " SELECT * FROM VALUES (2L, 'two'), (6L, 'six') AS s(id, v)",
    ]


def dml(path: str) -> list[str]:
    """UPDATE, DELETE and a MERGE with every clause group (versions 2, 3, 4)."""
    return [
        f"UPDATE delta.`{path}` SET v = 'u' WHERE id = 1",
        f"DELETE FROM delta.`{path}` WHERE id = 3",
        f"MERGE INTO delta.`{path}` AS t USING src AS s ON t.id = s.id"
        " WHEN MATCHED THEN UPDATE SET v = s.v"
        " WHEN NOT MATCHED THEN INSERT *"
        " WHEN NOT MATCHED BY SOURCE AND t.id = 5 THEN DELETE",
    ]


def changes_query(path: str) -> str:
    """The change feed of the DML versions as one line: ``CDF <kind:id ...>``."""
    return (
        "SELECT 'CDF' AS tag, array_join(sort_array(collect_list("
        "concat(_change_type, ':', CAST(id AS STRING)))), ' ') AS changes"
        f" FROM table_changes('delta.`{path}`', 2, 4)"
    )


def partition_overwrites(path: str) -> list[str]:
    """A static partition overwrite, then a dynamic one (SQL's way of replaceWhere)."""
    return [
        f"INSERT OVERWRITE delta.`{path}` PARTITION (p = 1) VALUES (10)",
        "SET spark.sql.sources.partitionOverwriteMode = dynamic",
        f"INSERT OVERWRITE delta.`{path}` VALUES (20, 2), (30, 3)",
        "SET spark.sql.sources.partitionOverwriteMode = static",
    ]


def commands(t: Tables) -> list[str]:
    """VACUUM the deletion-vector table and clone it, empty the clone and replace it by a
    clone again, RESTORE the change-feed one, then show it."""
    return [
        "SET spark.databricks.delta.retentionDurationCheck.enabled = false",
        f"VACUUM delta.`{t.dv}` RETAIN 0 HOURS",
        f"CREATE TABLE delta.`{t.clone}` SHALLOW CLONE delta.`{t.dv}`",
        f"DELETE FROM delta.`{t.clone}`",
        f"CREATE OR REPLACE TABLE delta.`{t.clone}` SHALLOW CLONE delta.`{t.dv}`",
        f"RESTORE TABLE delta.`{t.cdf}` TO VERSION AS OF 1",
        f"DESCRIBE HISTORY delta.`{t.cdf}`",
        f"DESCRIBE DETAIL delta.`{t.cdf}`",
    ]


def bad(t: Tables) -> list[str]:
    """Two statements that must fail typed and change nothing."""
    return [
        f"UPDATE delta.`{t.cdf}` SET nosuch = 1",
        f"MERGE INTO delta.`{t.cdf}` AS t USING src AS s ON id = id WHEN MATCHED THEN UPDATE SET *",
    ]


def script(t: Tables, *, overwrites: bool = True) -> list[str]:
    """Every statement of the scenario but the bad ones, in order."""
    return [
        *setup(t),
        *dml(t.cdf),
        *dml(t.dv),
        changes_query(t.cdf),
        *(partition_overwrites(t.parts) if overwrites else []),
        *commands(t),
    ]


def rows(path: str, version: int | None = None) -> list[tuple[object, ...]]:
    """The table's rows as delta-rs's DataFusion reader sees them (it applies deletion
    vectors; ``to_pyarrow_table`` refuses tables that have them)."""
    table = DeltaTable(path, version=version)
    result = pa.table(QueryBuilder().register("t", table).execute("SELECT * FROM t").read_all())
    return sorted(tuple(r.values()) for r in result.to_pylist())


def check_tables(t: Tables, *, overwrites: bool = True) -> None:
    """What the scenario leaves, read with delta-rs: contents, history, metrics, the
    change and deletion-vector files, VACUUM's and RESTORE's effects."""
    for path in (t.cdf, t.dv):
        assert rows(path, version=4) == AFTER_DML, path
        history = DeltaTable(path).history()
        by_version = {h["version"]: h for h in history}
        assert [by_version[v]["operation"] for v in (2, 3, 4)] == ["UPDATE", "DELETE", "MERGE"]
        assert int(by_version[2]["operationMetrics"]["numUpdatedRows"]) == 1
        assert int(by_version[3]["operationMetrics"]["numDeletedRows"]) == 1
        # delta-spark's names, as DESCRIBE HISTORY shows them (a MERGE that delta-rs
        # committed records delta-rs's own, which deltaflow translates).
        merge = history_metrics(by_version[4], path) or by_version[4]["operationMetrics"]
        assert (
            int(merge["numTargetRowsUpdated"]),
            int(merge["numTargetRowsInserted"]),
            int(merge["numTargetRowsDeleted"]),
        ) == (1, 1, 1), merge
    # The clone reads the vacuumed table's files, deletion vectors applied.
    assert rows(t.clone) == AFTER_DML
    assert [h["operation"] for h in DeltaTable(t.clone).history()] == ["CLONE", "DELETE", "CLONE"]
    assert rows(t.clone, version=1) == []
    # The change feed's files for the DML commits; deletion vectors for the other table.
    assert any((Path(t.cdf) / "_change_data").iterdir())
    dv_delete = (Path(t.dv) / "_delta_log" / f"{3:020d}.json").read_text()
    assert '"deletionVector"' in dv_delete
    # RESTORE brought version 1's rows back as a new version.
    assert rows(t.cdf) == [(i, f"v{i}") for i in range(1, 6)]
    assert [h["operation"] for h in DeltaTable(t.cdf).history()] == HISTORY
    # VACUUM RETAIN 0 HOURS left exactly the data files the table references.
    referenced = {Path(u).name for u in DeltaTable(t.dv).file_uris()}
    on_disk = {
        p.name
        for p in Path(t.dv).rglob("*.parquet")
        if "_delta_log" not in p.parts and "_change_data" not in p.parts
    }
    assert on_disk == referenced
    assert rows(t.dv) == AFTER_DML
    if overwrites:
        assert rows(t.parts, version=2) == PARTITIONS_AFTER_STATIC
        assert rows(t.parts) == PARTITIONS_AFTER_DYNAMIC
        assert DeltaTable(t.parts).metadata().partition_columns == ["p"]


def check_unchanged_by_bad(t: Tables) -> None:
    """The bad statements committed nothing: RESTORE is still the last version."""
    assert DeltaTable(t.cdf).history(1)[0]["operation"] == "RESTORE"


def typed_errors(text: str) -> list[str]:
    """The deltaflow error class names carried by the wire markers in ``text``."""
    found = []
    for marker in re.findall(r"\[deltaflow-error:[A-Za-z0-9+/=]+\]", text):
        error = from_wire(marker)
        if error is not None:
            found.append(type(error).__name__)
    return found


def result_line(text: str, tag: str) -> str | None:
    """The value after ``tag`` on the output line that starts with it (tab, comma or
    space separated), or None."""
    for line in text.splitlines():
        match = re.match(rf"^\"?{re.escape(tag)}\"?[\t, |]+(.*?)[\s|]*$", line.strip())
        if match:
            return match.group(1).strip('"')
    return None


def dumps(value: object) -> str:
    return json.dumps(value, default=str)
