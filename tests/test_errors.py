"""The error tree: structured fields, pickling, and the worker-to-driver wire format."""

from __future__ import annotations

import base64
import json
import pickle

import pytest

import deltaflow
from deltaflow.errors import DeltaflowError, from_wire, raising_typed, to_wire
from deltaflow.table.errors import ConcurrentWriteError, SchemaMismatchError


def test_errors_pickle_with_their_fields():
    error = SchemaMismatchError("bad", table_uri="file:///t", columns=("a", "b"))
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is SchemaMismatchError
    assert (clone.table_uri, clone.columns, str(clone)) == ("file:///t", ("a", "b"), "bad")


def test_wire_round_trip_keeps_type_and_fields():
    error = ConcurrentWriteError(
        "lost a race", table_uri="s3://b/t", kind="ConcurrentAppend", read_version=3, attempts=15
    )
    text = f"PythonException: Traceback ... {to_wire(error)} ... more text"
    clone = from_wire(text)
    assert isinstance(clone, ConcurrentWriteError) and clone.retryable
    assert (clone.kind, clone.read_version, clone.attempts) == ("ConcurrentAppend", 3, 15)


def test_wire_ignores_unknown_types_and_garbage():
    forged = base64.b64encode(
        json.dumps({"type": "os.system", "message": "x", "fields": {}}).encode()
    ).decode()
    assert from_wire(f"[deltaflow-error:{forged}]") is None
    assert from_wire("[deltaflow-error:!!notbase64]") is None
    assert from_wire("no marker here") is None


def test_public_errors_share_one_root():
    for name in deltaflow.__all__:
        value = getattr(deltaflow, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, DeltaflowError), name


def test_import_has_no_side_effects(tmp_path):
    """Importing deltaflow starts no JVM, no Spark session and touches no files."""
    import subprocess
    import sys

    code = (
        "import os, deltaflow\n"
        "from pyspark import SparkContext\n"
        "print(SparkContext._gateway is None, SparkContext._active_spark_context is None,"
        " os.listdir('.'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "True True []"


def test_raising_typed_raises_the_carried_error_and_leaves_others_alone():
    carried = SchemaMismatchError("n is INT, got STRING", table_uri="file:///t", columns=("n",))
    wrapper = RuntimeError("py4j said: " + to_wire(carried))
    with pytest.raises(SchemaMismatchError) as raised, raising_typed():
        raise wrapper
    assert raised.value.table_uri == "file:///t"
    assert raised.value.__cause__ is wrapper
    with pytest.raises(SchemaMismatchError) as quiet, raising_typed(keep_cause=False):
        raise wrapper
    assert quiet.value.__cause__ is None and quiet.value.__suppress_context__
    plain = ValueError("no marker here")
    with pytest.raises(ValueError) as untouched, raising_typed():
        raise plain
    assert untouched.value is plain
