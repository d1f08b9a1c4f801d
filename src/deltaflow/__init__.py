"""deltaflow: a streaming lakehouse for Python on Apache Spark.

Delta Lake tables through Spark's Python Data Source API, with delta-rs for the
transaction log; no JVM jars to fetch. Importing this package has no side
effects: no Spark session starts and nothing touches storage.
"""

from deltaflow.errors import DeltaflowError, InvalidOptionError, UserCodeError
from deltaflow.spark import register, session
from deltaflow.table.errors import (
    ConcurrentWriteError,
    SchemaMismatchError,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnsupportedFeatureError,
    VersionNotFoundError,
)

__version__ = "0.1.0"

__all__ = [
    "ConcurrentWriteError",
    "DeltaflowError",
    "InvalidOptionError",
    "SchemaMismatchError",
    "TableAlreadyExistsError",
    "TableNotFoundError",
    "UnsupportedFeatureError",
    "UserCodeError",
    "VersionNotFoundError",
    "__version__",
    "register",
    "session",
]
