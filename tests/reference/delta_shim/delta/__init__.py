"""A stand-in for delta-spark's ``delta`` package that points every import at deltaflow.

It exists only so delta-spark's own Python test suite (``python/delta/tests`` of
delta-io/delta) runs unchanged against deltaflow: ``delta.tables`` is
``deltaflow.tables``, ``delta.exceptions`` is ``deltaflow.exceptions`` and
``configure_spark_with_delta_pip`` is ``deltaflow.configure`` plus the registration a
deltaflow session needs. See ``tests/reference/_deltaspark_suite.py``.
"""

from delta.pip_utils import configure_spark_with_delta_pip

__version__ = "4.4.1"  # the delta-spark release whose tests this shim stands under

__all__ = ["__version__", "configure_spark_with_delta_pip"]
