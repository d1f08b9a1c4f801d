"""Test helper: give an existing Delta table deletion vectors by committing a log entry by hand.

delta-rs cannot write DVs, so tests that need a table with DVs make one with
``deltalake.write_deltalake`` and then call :func:`add_deletion_vectors`, which
writes the DV files with deltaflow's writer and commits what a DELETE with DVs
would commit (protocol upgrade, table property, ``remove`` + ``add`` per file).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from deltaflow.table._deletion_vectors import (
    DeletionVectorDescriptor,
    inline_descriptor,
    read_deleted_rows,
    write_deletion_vector_file,
    write_deletion_vectors,
)

DV_FEATURE = "deletionVectors"

# Features implied by legacy protocol versions; a table moving to reader 3 /
# writer 7 must list them explicitly or it would silently lose them.
_LEGACY_READER_FEATURES = {1: [], 2: ["columnMapping"]}
_LEGACY_WRITER_FEATURES = {
    1: [],
    2: ["appendOnly", "invariants"],
    3: ["appendOnly", "invariants", "checkConstraints"],
    4: ["appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns"],
    5: [
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "generatedColumns",
        "columnMapping",
    ],
    6: [
        "appendOnly",
        "invariants",
        "checkConstraints",
        "changeDataFeed",
        "generatedColumns",
        "columnMapping",
        "identityColumns",
    ],
}


def _log_dir(table_path: str) -> str:
    return os.path.join(table_path, "_delta_log")


def _replay(table_path: str) -> tuple[int, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Latest version, protocol, metaData and active ``add`` actions (by path).

    Only JSON commits are replayed: tables made by ``write_deltalake`` in tests
    have no checkpoint unless the test creates one after this helper ran.
    """
    versions = sorted(
        int(name[:20])
        for name in os.listdir(_log_dir(table_path))
        if name.endswith(".json") and name[:20].isdigit()
    )
    if not versions or versions != list(range(versions[-1] + 1)):
        raise NotImplementedError("add_deletion_vectors needs every commit as JSON from 0")
    protocol: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    adds: dict[str, dict[str, Any]] = {}
    for version in versions:
        with open(os.path.join(_log_dir(table_path), f"{version:020d}.json")) as f:
            for line in f:
                if not line.strip():
                    continue
                action = json.loads(line)
                if "protocol" in action:
                    protocol = action["protocol"]
                elif "metaData" in action:
                    metadata = action["metaData"]
                elif "add" in action:
                    adds[action["add"]["path"]] = action["add"]
                elif "remove" in action:
                    adds.pop(action["remove"]["path"], None)
    return versions[-1], protocol, metadata, adds


def _upgraded_protocol(protocol: dict[str, Any]) -> dict[str, Any] | None:
    """The protocol with ``deletionVectors`` supported, or None if it already is."""
    reader = int(protocol.get("minReaderVersion", 1))
    writer = int(protocol.get("minWriterVersion", 1))
    reader_features = list(
        (protocol.get("readerFeatures") or []) if reader >= 3 else _LEGACY_READER_FEATURES[reader]
    )
    writer_features = list(
        (protocol.get("writerFeatures") or []) if writer >= 7 else _LEGACY_WRITER_FEATURES[writer]
    )
    if reader >= 3 and DV_FEATURE in reader_features and DV_FEATURE in writer_features:
        return None
    # Reader features must also be listed as writer features.
    for feature in [*reader_features, DV_FEATURE]:
        if feature not in writer_features:
            writer_features.append(feature)
    if DV_FEATURE not in reader_features:
        reader_features.append(DV_FEATURE)
    return {
        "minReaderVersion": 3,
        "minWriterVersion": 7,
        "readerFeatures": reader_features,
        "writerFeatures": writer_features,
    }


def add_deletion_vectors(
    table_path: str,
    deleted: dict[str, Iterable[int]],
    *,
    inline: bool = False,
    single_file: bool = False,
    prefix: str = "",
) -> int:
    """Mark rows of data files deleted with DVs and commit; returns the new version.

    ``deleted`` maps data file paths, exactly as in the log's ``add`` actions, to
    row indexes within that file. Rows already deleted by an existing DV stay
    deleted (the new DV is the union). ``inline`` stores the DVs in the log
    (``storageType 'i'``); ``single_file`` packs all DVs into one file at
    different offsets; ``prefix`` puts DV files in that subdirectory.
    """
    table_path = os.path.abspath(table_path)
    version, protocol, metadata, adds = _replay(table_path)

    rows_per_file: list[np.ndarray] = []
    for path, rows in deleted.items():
        if path not in adds:
            raise ValueError(f"{path!r} is not an active file of {table_path}")
        add = adds[path]
        new_rows = np.asarray(list(rows), dtype=np.uint64)
        num_records = json.loads(add["stats"])["numRecords"]
        if new_rows.size and int(new_rows.max()) >= num_records:
            raise ValueError(f"{path!r} has {num_records} rows, cannot delete row {new_rows.max()}")
        if add.get("deletionVector"):
            old = read_deleted_rows(
                table_path, DeletionVectorDescriptor.from_json(add["deletionVector"])
            )
            new_rows = np.union1d(old, new_rows)
        rows_per_file.append(new_rows)

    descriptors: list[DeletionVectorDescriptor]
    if inline:
        descriptors = [inline_descriptor(rows) for rows in rows_per_file]
    elif single_file:
        descriptors = write_deletion_vectors(table_path, rows_per_file, prefix=prefix)
    else:
        descriptors = [
            write_deletion_vector_file(table_path, rows, prefix=prefix) for rows in rows_per_file
        ]

    now_ms = int(time.time() * 1000)
    actions: list[dict[str, Any]] = [
        {
            "commitInfo": {
                "timestamp": now_ms,
                "operation": "DELETE",
                "operationParameters": {"predicate": "[]"},
                "engineInfo": "deltaflow-tests",
                "operationMetrics": {
                    "numDeletionVectorsAdded": len(descriptors),
                    "numDeletedRows": int(sum(d.cardinality for d in descriptors)),
                },
            }
        }
    ]
    new_protocol = _upgraded_protocol(protocol)
    if new_protocol is not None:
        actions.append({"protocol": new_protocol})
    configuration = dict(metadata.get("configuration") or {})
    if configuration.get("delta.enableDeletionVectors") != "true":
        configuration["delta.enableDeletionVectors"] = "true"
        actions.append({"metaData": {**metadata, "configuration": configuration}})

    for path, descriptor in zip(deleted, descriptors, strict=True):
        old_add = adds[path]
        remove: dict[str, Any] = {
            "path": path,
            "deletionTimestamp": now_ms,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": old_add.get("partitionValues") or {},
            "size": old_add["size"],
        }
        if old_add.get("stats"):
            remove["stats"] = old_add["stats"]
        if old_add.get("deletionVector"):
            remove["deletionVector"] = old_add["deletionVector"]
        actions.append({"remove": remove})

        # Min/max no longer necessarily occur among the surviving rows: the
        # protocol's "wide bounds". numRecords stays the physical row count.
        stats = json.loads(old_add["stats"])
        stats["tightBounds"] = False
        new_add = {
            **old_add,
            "dataChange": True,
            "stats": json.dumps(stats, separators=(",", ":")),
            "deletionVector": descriptor.to_json(),
        }
        actions.append({"add": new_add})

    new_version = version + 1
    commit = os.path.join(_log_dir(table_path), f"{new_version:020d}.json")
    # 'x' = create only if absent, the put-if-absent a Delta commit needs.
    with open(commit, "x") as f:
        f.write("\n".join(json.dumps(action, separators=(",", ":")) for action in actions))
        f.write("\n")
    return new_version
