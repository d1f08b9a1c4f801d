"""delta-spark's ``delta.exceptions``, for code written against delta-spark.

``from deltaflow.exceptions import ConcurrentAppendException`` catches what
``delta.exceptions.ConcurrentAppendException`` catches with delta-spark: a commit that
lost a conflict with a concurrent writer. Each class is also a
:class:`deltaflow.ConcurrentWriteError` (with ``kind``, ``table_uri``, ``read_version``,
``attempts``), and every one is a :class:`DeltaConcurrentModificationException`, as in
delta-spark's Scala hierarchy.

Unlike delta-spark's, these are not ``pyspark.errors.PySparkException`` subclasses
(importing this module does not import pyspark). A conflict raised inside a Spark job
reaches the driver wrapped by Spark; ``deltaflow.typed_error(exc)`` returns the class
here that it carries.
"""

from deltaflow.table.errors import (
    ConcurrentAppendException,
    ConcurrentDeleteDeleteException,
    ConcurrentDeleteReadException,
    ConcurrentTransactionException,
    ConcurrentWriteException,
    DeltaConcurrentModificationException,
    MetadataChangedException,
    ProtocolChangedException,
)

__all__ = [
    "ConcurrentAppendException",
    "ConcurrentDeleteDeleteException",
    "ConcurrentDeleteReadException",
    "ConcurrentTransactionException",
    "ConcurrentWriteException",
    "DeltaConcurrentModificationException",
    "MetadataChangedException",
    "ProtocolChangedException",
]
