"""What liquid clustering adds to a commit (tables delta-rs 1.6 cannot commit to).

Every commit to a clustered table, and every commit that declares ``CLUSTER BY`` (CTAS,
RTAS, ``writeTo().clusterBy``, CREATE [OR REPLACE] TABLE), goes through
:mod:`deltaflow.table._log_write`, which calls :func:`add_clustering` on each: the
``clustering`` and ``domainMetadata`` features, and the ``delta.clustering`` domain when
the commit creates the table or changes its clustering columns. RESTORE puts the restored
version's clustering columns back (:func:`restored_domains`), as delta-spark does.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from deltaflow.table import _clustering

if TYPE_CHECKING:
    from deltaflow.table._commit import CommitRequest
    from deltaflow.table._log_write import Draft
    from deltaflow.table._snapshot import Snapshot


def add_clustering(request: CommitRequest, draft: Draft) -> Draft:
    """The hook of :mod:`~deltaflow.table._log_write` for ``CLUSTER BY``."""
    current = draft.current
    requested = request.clustering_columns
    if requested is None:
        clustered = current is not None and _clustering.is_clustered(current.writer_features)
        if not (request.replace_table and clustered):
            return draft
        requested = ()  # REPLACE without CLUSTER BY: clustered by no column from now on
    columns = _clustering.resolve_columns(
        draft.schema,
        draft.configuration,
        requested,
        label=draft.label,
        uri=draft.uri,
        partition_columns=draft.partition_columns,
    )
    creates = current is None or request.replace_table
    domains = draft.domains
    parameters = draft.parameters
    if creates:
        parameters = {**parameters, "clusterBy": json.dumps([".".join(c) for c in columns])}
    if (
        current is None
        or creates
        or columns != _clustering.physical_columns(draft.uri, current.version)
    ):
        domains = (*domains, _clustering.domain_action(columns))
    return dataclasses.replace(
        draft,
        features=draft.features | _clustering.FEATURES,
        domains=domains,
        parameters=parameters,
    )


def restored_domains(uri: str, snapshot: Snapshot, target: Snapshot) -> list[dict[str, Any]]:
    """The ``delta.clustering`` domain RESTORE writes: ``target``'s clustering columns
    when they differ from the current ones (no column when ``target`` had none)."""
    if not _clustering.is_clustered(snapshot.writer_features):
        return []
    then = _clustering.physical_columns(uri, target.version)
    if then == _clustering.physical_columns(uri, snapshot.version):
        return []
    return [_clustering.domain_action(then)]
