"""A bare Python stream source: Parquet files read with pyarrow, no Delta logic at all.

The ceiling (and the latency floor) of Spark's Python stream source API, run beside
deltaflow's Delta source in the streaming benchmarks. Its offset is how many files
``list_files(options)`` returns (in that order; ``options`` are the reader's, with the
path given to ``load()``); a micro-batch reads the new ones, grouped into tasks by
``group``. The classes are made inside ``register`` so that Spark's workers
receive them, and the two callables, by value (the bench modules are not importable
there).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, NamedTuple


def register(
    spark: Any,
    name: str,
    schema: Any,
    list_files: Callable[[dict[str, str]], list[str]],
    group: Callable[[list[str]], list[list[str]]],
) -> None:
    from pyspark import cloudpickle
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    cloudpickle.register_pickle_by_value(sys.modules[__name__])

    class Files(InputPartition):
        def __init__(self, paths: list[str]) -> None:
            self.paths = paths

    class BareReader(DataSourceStreamReader):
        def __init__(self, options: dict[str, str]) -> None:
            self.options = options

        def initialOffset(self) -> dict:
            return {"files": 0}

        def latestOffset(self, start: dict, limit: Any) -> dict:
            return {"files": len(list_files(self.options))}

        def partitions(self, start: dict, end: dict) -> list:
            new = list_files(self.options)[start["files"] : end["files"]]
            return [Files(paths) for paths in group(new)] if new else []

        def read(self, partition: Any) -> Any:
            import pyarrow.parquet as pq

            for path in partition.paths:
                yield from pq.ParquetFile(path).iter_batches(batch_size=65536, use_threads=False)

        def commit(self, end: dict) -> None:
            pass

    class BareSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> Any:
            return schema

        def streamReader(self, schema: Any) -> Any:
            return BareReader(dict(self.options))

    spark.dataSource.register(BareSource)


class _SizedFile(NamedTuple):
    path: str
    size: int


def as_deltaflow_groups(paths: list[str]) -> list[list[str]]:
    """``paths`` grouped into tasks as deltaflow's source groups them (``bin_pack``)."""
    from deltaflow.spark.read._reader import bin_pack

    sized = [_SizedFile(p, os.path.getsize(p)) for p in paths]
    return [[f.path for f in group] for group in bin_pack(sized, os.cpu_count() or 2)]
