"""The interop matrix: one Delta feature per table, written as SQL either engine runs.

A feature is the statements that build its table (run by the *writer*: deltaflow or
delta-spark), the statements the *other* engine then runs on top of it (a write or DML on a
table it did not create), and statements that both engines must refuse (a CHECK
constraint's violation). ``{path}`` stands for the table's location.
"""

from __future__ import annotations

from dataclasses import dataclass

T = "delta.`{path}`"


@dataclass(frozen=True)
class Feature:
    name: str
    setup: tuple[str, ...]
    on_top: tuple[str, ...] = ()
    refused: tuple[str, ...] = ()
    cdf_from: int | None = None
    # A text every table of this feature has in its log (proof the feature was exercised);
    # without quotes: schema metadata sits JSON-escaped inside the schemaString.
    log_marker: str | None = None


FEATURES = [
    Feature(
        "partitioned",
        setup=(
            f"CREATE TABLE {T} (id INT, part STRING, x DOUBLE) USING delta PARTITIONED BY (part)",
            f"INSERT INTO {T} VALUES (1, 'a', 1.0), (2, 'b', 2.5), (3, NULL, 3.0), "
            "(4, 'a b/c=d%', 4.0), (5, 'b', -0.5)",
            f"DELETE FROM {T} WHERE part = 'b'",
            f"INSERT INTO {T} VALUES (6, 'c', 6.0), (7, NULL, 7.0)",
        ),
        on_top=(
            f"INSERT INTO {T} VALUES (8, 'b', 8.0), (9, 'a b/c=d%', 9.0)",
            f"UPDATE {T} SET x = x + 1 WHERE part = 'a' OR part IS NULL",
        ),
        log_marker='"partitionValues":{"part":"a b/c=d%"}',
    ),
    Feature(
        "change_data_feed",
        setup=(
            f"CREATE TABLE {T} (id INT, v STRING) USING delta "
            "TBLPROPERTIES ('delta.enableChangeDataFeed' = 'true')",
            f"INSERT INTO {T} VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd'), (5, 'e')",
            f"UPDATE {T} SET v = 'u' WHERE id <= 2",
            f"DELETE FROM {T} WHERE id = 5",
            f"MERGE INTO {T} t USING (SELECT * FROM VALUES (2, 'm'), (6, 'n') AS s(id, v)) s "
            "ON t.id = s.id WHEN MATCHED THEN UPDATE SET v = s.v WHEN NOT MATCHED THEN INSERT *",
        ),
        on_top=(
            f"UPDATE {T} SET v = 'w' WHERE id = 3",
            f"DELETE FROM {T} WHERE id = 1",
            f"MERGE INTO {T} t USING (SELECT * FROM VALUES (4, 'x'), (7, 'y') AS s(id, v)) s "
            "ON t.id = s.id WHEN MATCHED THEN DELETE WHEN NOT MATCHED THEN INSERT *",
        ),
        cdf_from=0,
        log_marker="_change_data/",
    ),
    Feature(
        "deletion_vectors",
        setup=(
            f"CREATE TABLE {T} (id INT, v STRING) USING delta "
            "TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')",
            f"INSERT INTO {T} SELECT CAST(id AS INT), CAST(id AS STRING) FROM range(0, 60)",
            f"DELETE FROM {T} WHERE id % 7 = 0",
            f"UPDATE {T} SET v = 'u' WHERE id % 5 = 0",
        ),
        on_top=(
            f"DELETE FROM {T} WHERE id % 3 = 0",
            f"UPDATE {T} SET v = 'w' WHERE id % 4 = 0",
            f"INSERT INTO {T} VALUES (100, 'new')",
        ),
        log_marker='"deletionVector":{',
    ),
    *[
        Feature(
            f"column_mapping_{mode}",
            setup=(
                f"CREATE TABLE {T} (id INT, v STRING, x INT, s STRUCT<a: INT, b: STRING>) "
                f"USING delta TBLPROPERTIES ('delta.columnMapping.mode' = '{mode}')",
                f"INSERT INTO {T} VALUES (1, 'a', 10, named_struct('a', 1, 'b', 'x')), "
                "(2, 'b', 20, named_struct('a', 2, 'b', 'y'))",
                f"ALTER TABLE {T} RENAME COLUMN v TO w",
                f"ALTER TABLE {T} RENAME COLUMN s.a TO a2",
                f"ALTER TABLE {T} DROP COLUMN x",
                f"INSERT INTO {T} VALUES (3, 'c', named_struct('a2', 3, 'b', 'z'))",
            ),
            on_top=(
                f"INSERT INTO {T} VALUES (4, 'd', named_struct('a2', 4, 'b', 'q'))",
                f"ALTER TABLE {T} RENAME COLUMN w TO w2",
                f"UPDATE {T} SET w2 = 'u' WHERE id = 1",
            ),
            log_marker="delta.columnMapping.physicalName",
        )
        for mode in ("name", "id")
    ],
    Feature(
        "liquid_clustering",
        setup=(
            f"CREATE TABLE {T} (k INT, v STRING) USING delta CLUSTER BY (k)",
            f"INSERT INTO {T} VALUES (3, 'c'), (1, 'a')",
            f"INSERT INTO {T} VALUES (2, 'b'), (5, 'e')",
            f"INSERT INTO {T} VALUES (4, 'd')",
            f"OPTIMIZE {T}",
        ),
        on_top=(f"INSERT INTO {T} VALUES (6, 'f'), (0, 'z')", f"OPTIMIZE {T}"),
        log_marker="clusteringColumns",
    ),
    Feature(
        "identity_and_generated",
        setup=(
            f"CREATE TABLE {T} (id BIGINT GENERATED ALWAYS AS IDENTITY "
            "(START WITH 10 INCREMENT BY 5), x INT, g INT GENERATED ALWAYS AS (x * 2)) "
            "USING delta",
            f"INSERT INTO {T} (x) VALUES (1), (2), (3)",
            f"INSERT INTO {T} (x) VALUES (4)",
        ),
        on_top=(
            f"INSERT INTO {T} (x) VALUES (5), (6)",
            f"UPDATE {T} SET x = x + 100 WHERE x = 1",
        ),
        log_marker="delta.identity.highWaterMark",
    ),
    Feature(
        "check_constraints",
        setup=(
            f"CREATE TABLE {T} (id INT, x INT) USING delta",
            f"INSERT INTO {T} VALUES (1, 5), (2, 6)",
            f"ALTER TABLE {T} ADD CONSTRAINT x_positive CHECK (x > 0)",
            f"INSERT INTO {T} VALUES (3, 7)",
        ),
        on_top=(f"INSERT INTO {T} VALUES (4, 8)", f"UPDATE {T} SET x = x + 1 WHERE id = 1"),
        refused=(f"INSERT INTO {T} VALUES (5, -1)", f"UPDATE {T} SET x = -x WHERE id = 2"),
        log_marker="delta.constraints.x_positive",
    ),
    Feature(
        "checkpoints",
        setup=(
            f"CREATE TABLE {T} (id INT, v STRING) USING delta "
            "TBLPROPERTIES ('delta.checkpointInterval' = '2')",
            *[f"INSERT INTO {T} VALUES ({i}, 'v{i}')" for i in range(1, 6)],
            f"DELETE FROM {T} WHERE id = 2",
        ),
        on_top=tuple(f"INSERT INTO {T} VALUES ({i}, 'w{i}')" for i in range(6, 9)),
    ),
    Feature(
        "v2_checkpoints",
        setup=(
            f"CREATE TABLE {T} (id INT, v STRING) USING delta TBLPROPERTIES "
            "('delta.checkpointPolicy' = 'v2', 'delta.checkpointInterval' = '2')",
            *[f"INSERT INTO {T} VALUES ({i}, 'v{i}')" for i in range(1, 5)],
        ),
        on_top=tuple(f"INSERT INTO {T} VALUES ({i}, 'w{i}')" for i in range(5, 8)),
        log_marker="v2Checkpoint",
    ),
    Feature(
        "type_widening",
        setup=(
            f"CREATE TABLE {T} (id INT, n SMALLINT, f FLOAT) USING delta "
            "TBLPROPERTIES ('delta.enableTypeWidening' = 'true')",
            f"INSERT INTO {T} VALUES (1, 100, 1.5)",
            f"ALTER TABLE {T} ALTER COLUMN n TYPE INT",
            f"ALTER TABLE {T} ALTER COLUMN f TYPE DOUBLE",
            f"INSERT INTO {T} VALUES (2, 100000, 2.25)",
        ),
        on_top=(
            f"INSERT INTO {T} VALUES (3, 200000, 3.5)",
            # Rows of files written before the widening, rewritten at the new type.
            f"UPDATE {T} SET n = n * 1000, f = f * 2 WHERE id = 1",
            f"MERGE INTO {T} t USING (SELECT * FROM VALUES (2, 70000, 0.125D), (4, -70000, 4.5D)"
            " AS s(id, n, f)) s ON t.id = s.id WHEN MATCHED THEN DELETE"
            " WHEN NOT MATCHED THEN INSERT *",
        ),
        log_marker="delta.typeChanges",
    ),
    Feature(
        "timestamp_ntz",
        setup=(
            f"CREATE TABLE {T} (id INT, t TIMESTAMP_NTZ, ts TIMESTAMP, d DATE) USING delta",
            f"INSERT INTO {T} VALUES "
            "(1, TIMESTAMP_NTZ'2026-01-02 03:04:05.123456', "
            "TIMESTAMP'2026-01-02 03:04:05.123456', DATE'2026-01-02'), "
            "(2, NULL, NULL, NULL), "
            "(3, TIMESTAMP_NTZ'1900-01-01 00:00:00', TIMESTAMP'1900-01-01 00:00:00', "
            "DATE'1900-01-01')",
        ),
        on_top=(
            f"INSERT INTO {T} VALUES (4, TIMESTAMP_NTZ'2000-02-29 23:59:59.999999', "
            "TIMESTAMP'2000-02-29 23:59:59.999999', DATE'2000-02-29')",
            f"UPDATE {T} SET t = t + INTERVAL 1 DAY WHERE id = 1",
        ),
        log_marker="timestampNtz",
    ),
    Feature(
        "variant",
        setup=(
            f"CREATE TABLE {T} (id INT, v VARIANT) USING delta",
            f'INSERT INTO {T} VALUES (1, parse_json(\'{{"a": 1, "b": [1, 2.5, null]}}\')), '
            "(2, parse_json('\"s\"')), (3, NULL)",
        ),
        on_top=(
            f'INSERT INTO {T} VALUES (4, parse_json(\'{{"c": {{"d": true}}}}\'))',
            f"DELETE FROM {T} WHERE id = 2",
        ),
        log_marker="variantType",
    ),
]
