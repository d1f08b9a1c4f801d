"""deltaflow.exceptions: delta-spark's conflict exception classes, raised by real conflicts.

Every conflict below is a real concurrent commit (delta-rs, or another deltaflow commit)
landing between a transaction's read and its commit, as in tests/table/test_log_commit.py.
"""

from __future__ import annotations

import pickle
import subprocess
import sys

import pytest
from deltalake import DeltaTable as RsTable

import deltaflow.exceptions as dx
from deltaflow import ConcurrentWriteError, typed_error
from deltaflow.errors import RemoteDeltaflowError, from_wire, to_wire
from deltaflow.table import _commit, _log_commit
from tests.table.test_log_commit import _make, _rewrite

DELTA_SPARK_NAMES = [
    "DeltaConcurrentModificationException",
    "ConcurrentWriteException",
    "MetadataChangedException",
    "ProtocolChangedException",
    "ConcurrentAppendException",
    "ConcurrentDeleteReadException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentTransactionException",
]


def test_module_has_delta_spark_names_all_conflict_errors():
    assert sorted(dx.__all__) == sorted(DELTA_SPARK_NAMES)
    for name in DELTA_SPARK_NAMES:
        cls = getattr(dx, name)
        assert issubclass(cls, ConcurrentWriteError), name
        assert issubclass(cls, dx.DeltaConcurrentModificationException), name
        assert cls.retryable


def test_importing_exceptions_does_not_import_pyspark():
    code = "import sys, deltaflow.exceptions; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("ConcurrentAppend", dx.ConcurrentAppendException),
        ("ConcurrentDeleteRead", dx.ConcurrentDeleteReadException),
        ("ConcurrentDeleteDelete", dx.ConcurrentDeleteDeleteException),
        ("MetadataChanged", dx.MetadataChangedException),
        ("ProtocolChanged", dx.ProtocolChangedException),
        ("ConcurrentTransaction", dx.ConcurrentTransactionException),
        ("ConcurrentWrite", dx.ConcurrentWriteException),
        ("Conflict", dx.DeltaConcurrentModificationException),  # delta-rs named none
    ],
)
def test_each_kind_is_its_class_and_survives_pickle_and_the_wire(kind, expected):
    error = ConcurrentWriteError(
        "lost", table_uri="file:///t", kind=kind, read_version=4, attempts=2
    )
    assert type(error) is expected
    assert (error.kind, error.read_version, error.attempts, str(error)) == (kind, 4, 2, "lost")
    assert type(pickle.loads(pickle.dumps(error))) is expected
    assert type(from_wire(f"worker said: {to_wire(error)}")) is expected
    # What Spark hands the driver for a worker's error: text around the marker.
    wrapped = RuntimeError(str(RemoteDeltaflowError(error)))
    found = typed_error(wrapped)
    assert type(found) is expected and found.table_uri == "file:///t"


def test_a_marker_naming_the_parent_class_comes_back_as_the_kind_class():
    # The JVM (or an older deltaflow) may send type ConcurrentWriteError with a kind field.
    import base64
    import json

    payload = {
        "type": "ConcurrentWriteError",
        "message": "m",
        "fields": {"table_uri": "u", "kind": "MetadataChanged", "read_version": 1, "attempts": 1},
    }
    marker = base64.b64encode(json.dumps(payload).encode()).decode()
    assert type(from_wire(f"[deltaflow-error:{marker}]")) is dx.MetadataChangedException


def test_concurrent_delete_read_raises_delta_spark_class(table_path):
    path = _make(table_path())
    request = _rewrite(path, "a", [0], read_version=1)
    RsTable(path).delete("id <= 2")  # removes the whole file the request read
    with pytest.raises(dx.ConcurrentDeleteReadException) as info:
        _commit.commit(request)
    assert isinstance(info.value, ConcurrentWriteError)
    assert info.value.kind == "ConcurrentDeleteRead" and info.value.read_version == 1
    assert RsTable(path).version() == 2  # nothing committed


def test_concurrent_append_and_delete_delete_classes(table_path):
    path = _make(table_path())
    request = _rewrite(path, "a", [0], read_version=1)
    RsTable(path).delete("id = 2")  # rewrites the partition read: new data in it
    with pytest.raises(dx.ConcurrentAppendException):
        _commit.commit(request)

    path = _make(table_path())
    blind = _rewrite(
        path, "a", [0], read_version=1, read_set=_log_commit.ReadSet(blind_append=True)
    )
    RsTable(path).delete("id = 2")
    with pytest.raises(dx.ConcurrentDeleteDeleteException):
        _commit.commit(blind)


def test_metadata_change_and_app_transaction_classes(table_path):
    path = _make(table_path())
    request = _rewrite(path, "a", [0], read_version=1)
    RsTable(path).alter.set_table_properties({"delta.logRetentionDuration": "interval 9 days"})
    with pytest.raises(dx.MetadataChangedException):
        _commit.commit(request)

    path = _make(table_path())
    mine = _rewrite(path, "a", [0], read_version=1, app_id="stream-1", app_version=5)
    theirs = _rewrite(path, "b", [3], read_version=1, app_id="stream-1", app_version=5)
    _commit.commit(theirs)
    with pytest.raises(dx.ConcurrentTransactionException) as info:
        _commit.commit(mine)
    # The parent class still catches it, as before.
    assert isinstance(info.value, ConcurrentWriteError)
