"""``configure_spark_with_delta_pip`` is ``deltaflow.configure`` plus registration."""

from __future__ import annotations

from typing import Any

import deltaflow


class _RegisteringBuilder:
    """A builder whose ``getOrCreate`` also runs ``deltaflow.register`` on the session."""

    def __init__(self, builder: Any) -> None:
        self._builder = builder

    def getOrCreate(self) -> Any:
        return deltaflow.register(self._builder.getOrCreate())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._builder, name)


def configure_spark_with_delta_pip(
    spark_session_builder: Any, extra_packages: list[str] | None = None
) -> Any:
    """deltaflow's settings on the builder; ``extra_packages`` go to spark.jars.packages as
    delta-spark's function puts them (deltaflow itself needs none)."""
    builder = deltaflow.configure(spark_session_builder)
    if extra_packages:
        builder = builder.config("spark.jars.packages", ",".join(extra_packages))
    return _RegisteringBuilder(builder)
