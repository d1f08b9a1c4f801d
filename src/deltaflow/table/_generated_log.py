"""The log side of identity columns: what they add to a commit.

delta-rs 1.6 neither gives a new table the ``identityColumns`` protocol (writer version
6) nor commits to a table that has it, so every commit to such a table goes through
:mod:`deltaflow.table._log_write`, which calls :func:`add_high_water_marks` on each:
when the write handed out identity values, the commit's ``metaData`` carries the new
``delta.identity.highWaterMark`` (the highest value written for a positive step, the
lowest for a negative one, from the files' stats), as delta-spark does. A metadata
change conflicts with every concurrent commit that changes metadata too, so two writers
that both generate identity values cannot both commit (the later one fails with
``ConcurrentWriteError(kind="MetadataChanged")``): values stay unique.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from deltaflow.table import _generated

if TYPE_CHECKING:
    from deltaflow.table._commit import CommitRequest
    from deltaflow.table._log_write import Draft


def add_high_water_marks(request: CommitRequest, draft: Draft) -> Draft:
    """The hook of :mod:`~deltaflow.table._log_write`: the identity columns whose values
    this write generated get their new high water marks in the commit's schema."""
    if not request.identity_generated or not request.adds:
        return draft
    marks = _generated.high_water_marks(
        _generated.identity_columns(draft.schema),
        request.identity_generated,
        (a.stats for a in request.adds),
    )
    if not marks:
        return draft
    return dataclasses.replace(draft, schema=_generated.with_high_water_marks(draft.schema, marks))


def keep_high_water_marks(schema: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` (an older version's, for RESTORE) with the high water marks of
    ``current``: values handed out since must never be handed out again."""
    marks = {
        c.name: c.high_water_mark
        for c in _generated.identity_columns(current)
        if c.high_water_mark is not None
    }
    if not marks or not _generated.identity_columns(schema):
        return dict(schema)
    return _generated.with_high_water_marks(schema, marks)
