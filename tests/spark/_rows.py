"""Rows to compare: a DataFrame's rows in a stable order, and one commit's change rows."""

from __future__ import annotations

from typing import Any


def sorted_tuples(df: Any) -> list[tuple[Any, ...]]:
    """``df``'s rows as tuples, ordered by their repr (None sorts beside values)."""
    return sorted((tuple(r) for r in df.collect()), key=repr)


def version_changes(spark: Any, path: str, version: int) -> Any:
    """The change feed of table ``path`` at exactly ``version``, as a DataFrame."""
    return (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", version)
        .option("endingVersion", version)
        .load(path)
    )
