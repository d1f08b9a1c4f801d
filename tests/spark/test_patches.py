"""The remaining pyspark patches: one table, a version guard, install and uninstall."""

from __future__ import annotations

import pytest

from deltaflow.spark import _patches
from deltaflow.spark.errors import PysparkCompatibilityError


def _methods() -> dict[tuple[str, str], object]:
    return {
        (p.cls, m): _patches._class(p.cls).__dict__.get(m)
        for p in _patches.PATCHES
        for m in p.methods
    }


def test_uninstall_restores_every_original_and_install_patches_again(spark, table_path):
    patched = _methods()
    _patches.uninstall()
    try:
        originals = _methods()
        changed = [key for key in patched if patched[key] is not originals[key]]
        assert changed, "uninstall changed nothing"
        from pyspark.sql.readwriter import DataFrameReader

        assert DataFrameReader.load.__module__ == "pyspark.sql.readwriter"
        assert not [n for n in vars(DataFrameReader) if n.startswith("_deltaflow")]
    finally:
        _patches.install()
    again = _methods()
    assert all(again[key] is not originals[key] for key in changed)
    # Patched again: a missing table is a typed error in the caller's process.
    import deltaflow

    with pytest.raises(deltaflow.TableNotFoundError):
        spark.read.format("delta").load(table_path("missing"))


def test_a_moved_method_fails_loudly(monkeypatch):
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    monkeypatch.delattr(DataStreamWriter, "partitionBy")
    with pytest.raises(PysparkCompatibilityError) as info:
        _patches.check()
    assert info.value.where.endswith("DataStreamWriter.partitionBy")


def test_an_unsupported_pyspark_version_fails_loudly(monkeypatch):
    import pyspark

    monkeypatch.setattr(pyspark, "__version__", "5.0.0")
    with pytest.raises(PysparkCompatibilityError) as info:
        _patches.check()
    assert info.value.where == "pyspark"


@pytest.mark.parametrize("version", ["3.5.1", "3.5.7", "5.0.0", "5.1.0"])
def test_a_pyspark_the_connector_cannot_serve_is_refused_at_session_start(
    spark, monkeypatch, version
):
    import pyspark

    import deltaflow

    monkeypatch.setattr(pyspark, "__version__", version)
    for start in (deltaflow.spark_conf, deltaflow.session, lambda: deltaflow.register(spark)):
        with pytest.raises(PysparkCompatibilityError) as info:
            start()
        assert (info.value.where, info.value.version) == ("pyspark", version)
        assert info.value.supported == _patches.SUPPORTED_RANGE == ">=4.0,<5"
        assert "pip install 'pyspark>=4.0,<5'" in str(info.value)


@pytest.mark.parametrize("version", ["4.0.0", "4.0.5", "4.1.4", "4.2.1", "4.3.0", "4.9.0"])
def test_every_spark_4_minor_passes_the_version_check(monkeypatch, version):
    import pyspark

    monkeypatch.setattr(pyspark, "__version__", version)
    _patches.check_version()  # raises for a version outside the range
