"""A Spark session setting changed for a block of tests, then put back as it was."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def conf_set(spark: Any, key: str, value: str) -> Iterator[None]:
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


@contextlib.contextmanager
def confs_set(spark: Any, confs: dict[str, str]) -> Iterator[None]:
    """:func:`conf_set` for each of ``confs``."""
    with contextlib.ExitStack() as stack:
        for key, value in confs.items():
            stack.enter_context(conf_set(spark, key, value))
        yield
