"""deltaflow: a streaming lakehouse for Python on Apache Spark.

Delta Lake tables through deltaflow's own Spark connector (a DataSource V2 provider
compiled on this machine with the Scala compiler pyspark ships), with delta-rs for the
transaction log; nothing is fetched from Maven. Importing this package has no side
effects: no Spark session starts and nothing touches storage.
"""

from typing import TYPE_CHECKING, Any

from deltaflow._session import configure, register, session, spark_conf
from deltaflow.errors import DeltaflowError, InvalidOptionError, UserCodeError, typed_error
from deltaflow.table.errors import (
    ConcurrentWriteError,
    ConstraintViolationError,
    GeneratedColumnError,
    InvalidConstraintError,
    LocationNotEmptyError,
    ObjectStoreError,
    SchemaMismatchError,
    TableAlreadyExistsError,
    TableNotFoundError,
    UnsupportedFeatureError,
    VersionNotFoundError,
)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from deltaflow.spark.dml._delta_table import DeltaTable
    from deltaflow.spark.stream._progress import BatchProgress, StreamProgress, track_progress

# Names that need pyspark, loaded on first use so `import deltaflow` stays light.
_PROGRESS_NAMES = ("BatchProgress", "StreamProgress", "track_progress")


def __getattr__(name: str) -> Any:
    # DeltaTable needs pyspark; load it on first use so `import deltaflow` stays light.
    if name == "DeltaTable":
        from deltaflow.spark.dml._delta_table import DeltaTable

        return DeltaTable
    if name in _PROGRESS_NAMES:
        from deltaflow.spark.stream import _progress

        return getattr(_progress, name)
    raise AttributeError(f"module 'deltaflow' has no attribute {name!r}")


__all__ = [
    "BatchProgress",
    "ConcurrentWriteError",
    "ConstraintViolationError",
    "DeltaTable",
    "DeltaflowError",
    "GeneratedColumnError",
    "InvalidConstraintError",
    "InvalidOptionError",
    "LocationNotEmptyError",
    "ObjectStoreError",
    "SchemaMismatchError",
    "StreamProgress",
    "TableAlreadyExistsError",
    "TableNotFoundError",
    "UnsupportedFeatureError",
    "UserCodeError",
    "VersionNotFoundError",
    "__version__",
    "configure",
    "register",
    "session",
    "spark_conf",
    "track_progress",
    "typed_error",
]
