"""A flow's identity: the app id of its idempotent writes into its table.

Every route a flow writes by keys its commits by ``(identity, batch id)``: the Delta
stream sink (``FLOW_IDENTITY_OPTION``, a flow with no rules or only ``expect`` /
``expect_or_drop`` ones), ``foreachBatch`` with ``txnAppId`` / ``txnVersion`` (a flow with
an ``expect_or_fail`` rule, or any rules in a continuous update) and the single write of a
``once`` flow. One id for all of them is what lets a checkpoint move between routes (a
rule added or removed) while a batch replayed after a crash is still written once.

The identity is kept in the checkpoint (:data:`IDENTITY_FILE`), made with it: a full
refresh deletes the checkpoint, so batch ids restarting at 0 get a new identity instead of
being taken for replays.

Checkpoints from before every route took the identity: a flow without rules wrote
through the sink under the streaming query's id (Spark's ``metadata`` file in the
checkpoint). :func:`stream_identity` carries such a checkpoint over: with no identity
recorded it adopts the query id; with one recorded (the flow had rules once) it still
takes the query id when the batch pending in the checkpoint (the only one a restart
replays) reached the table under it.
"""

from __future__ import annotations

import uuid

from deltaflow.pipelines import _checkpoint_files
from deltaflow.pipelines._observed_stream import last_written_batch

IDENTITY_FILE = "deltaflow-flow-id"


def flow_identity(checkpoint: str) -> str:
    """The identity recorded in ``checkpoint``, made (a new one) if there is none."""
    recorded = _recorded(checkpoint)
    return recorded if recorded is not None else _record(checkpoint, _new_identity())


def stream_identity(checkpoint: str, table: str) -> str:
    """The identity a streaming flow into ``table`` writes under from now on: the one
    recorded, or the streaming query's id where the flow's earlier batches (or its pending
    one) were written under that (see the module docstring)."""
    recorded = _recorded(checkpoint)
    query = _query_id(checkpoint)
    if recorded is None:
        # No route with the identity has run: every batch so far (if any) went through
        # the sink, keyed by the query id.
        return _record(checkpoint, query if query is not None else _new_identity())
    if query is None or query == recorded:
        return recorded
    # Only a batch planned and not committed can be replayed; whichever id has it in the
    # table wrote it. With none pending both calls answer the last committed batch.
    if last_written_batch(checkpoint, table, query) > last_written_batch(
        checkpoint, table, recorded
    ):
        return _record(checkpoint, query)
    return recorded


def _new_identity() -> str:
    return f"deltaflow-pipeline-flow-{uuid.uuid4()}"


def _recorded(checkpoint: str) -> str | None:
    recorded = _checkpoint_files.read_text(checkpoint, IDENTITY_FILE)
    return (recorded or "").strip() or None


def _record(checkpoint: str, identity: str) -> str:
    # Whole or absent, whatever a crash interrupts.
    _checkpoint_files.write_text(checkpoint, IDENTITY_FILE, identity)
    return identity


def _query_id(checkpoint: str) -> str | None:
    """The streaming query's id in the checkpoint's ``metadata`` (None: never started)."""
    from deltaflow.spark.errors import StreamIdentityError
    from deltaflow.spark.stream._writer import query_id

    if not _checkpoint_files.exists(checkpoint, "metadata"):
        return None
    try:
        return query_id(checkpoint, table_uri=checkpoint)
    except StreamIdentityError:
        return None  # unreadable: Spark itself refuses such a checkpoint at start
