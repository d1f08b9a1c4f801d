"""Stage 5's model: which kind of event a tracker sent, told from its readings alone.

Every backfilled event carries the kind the tracker's firmware gave it (``event_type``:
heartbeat, step, workout start/end, sleep, battery low, fall). A model that tells the kind
from the sensor readings (heart rate, steps, battery) can label events from trackers whose
firmware does not. It is a scikit-learn decision tree, trained here on a labelled slice of
the backfill (a quarter held out to measure it), pickled once, broadcast once, and scored
in the pipeline's stream by an Arrow UDF (``pyspark.sql.functions.arrow_udf``): each
Python worker unpickles the model once per task and predicts a whole Arrow batch at a time.

The pipeline's datasets (declared in ``_declared.py``):

- ``event_features``, a streaming table: silver's events as the model's feature columns
  (doubles), with the label kept beside them for measuring, never for scoring;
- ``gold_event_kinds``, a streaming table: one prediction per feature row, with the id of
  the model that made it.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from demo._checks import DemoRunError, check

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

FEATURES = ("heart_rate", "steps", "battery_pct")
LABEL = "event_type"
# The first events on the wrist of the backfill (in event-time order) are the labelled
# slice; a quarter of them is held out. A few tens of thousands of rows already give the
# tree's accuracy (more only lengthen the demo).
TRAINING_ROWS = 80_000
HELD_OUT_SHARE = 0.25
# Depth 6 is as accurate as deeper trees here (0.97 vs 0.80 for always "heartbeat") and
# pickles to about 12 kB: cheap to broadcast and to unpickle in every task.
TREE_DEPTH = 6
SEED = 0
MODEL_FILE = "models/event_kind.pkl"


@dataclass(frozen=True)
class TrainedModel:
    blob: bytes  # the pickled estimator: what is broadcast and saved
    model_id: str  # the first 12 hex digits of the blob's SHA-256
    training_rows: int
    held_out: pa.Table  # event_id and the true event_type of the rows held out
    accuracy: float  # on the held-out rows, measured right after training


def train(events: pa.Table) -> TrainedModel:
    """Fit the tree on the first labelled events on the wrist of ``events`` (bronze rows)."""
    try:
        from sklearn.model_selection import train_test_split
        from sklearn.tree import DecisionTreeClassifier
    except ImportError as err:
        raise DemoRunError(
            "the demo trains a scikit-learn model: install it with `pip install scikit-learn`"
            " (or `pip install -e '.[dev]'`, which `make demo` does)"
        ) from err

    readings = events.select(["event_id", "event_time", *FEATURES, LABEL])
    on_wrist = readings.filter(pc.is_valid(readings["heart_rate"]))
    labelled = on_wrist.sort_by("event_time").slice(0, TRAINING_ROWS)
    features = _matrix(labelled)
    labels = labelled[LABEL].to_numpy(zero_copy_only=False)
    ids = labelled["event_id"].to_numpy(zero_copy_only=False)
    x_fit, x_held, y_fit, y_held, _, ids_held = train_test_split(
        features, labels, ids, test_size=HELD_OUT_SHARE, random_state=SEED, stratify=labels
    )
    tree = DecisionTreeClassifier(max_depth=TREE_DEPTH, random_state=SEED).fit(x_fit, y_fit)
    blob = pickle.dumps(tree)
    return TrainedModel(
        blob=blob,
        model_id=hashlib.sha256(blob).hexdigest()[:12],
        training_rows=len(y_fit),
        held_out=pa.table({"event_id": ids_held, LABEL: y_held}),
        accuracy=float(tree.score(x_held, y_held)),
    )


def save(model: TrainedModel, data_dir: Path) -> Path:
    """Keep the exact bytes that were broadcast, so anyone can score the features again."""
    path = data_dir / MODEL_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.blob)
    return path


def feature_columns() -> list[Column]:
    """Silver's columns as the features table holds them: keys, features, label."""
    from pyspark.sql import functions as F

    return [
        F.col("event_id"),
        F.col("device_id"),
        F.col("event_time"),
        *(F.col(name).cast("double").alias(name) for name in FEATURES),
        F.col(LABEL),
    ]


def predictions(features: DataFrame, predict: Callable[..., Column], model_id: str) -> DataFrame:
    """Score ``features`` (a stream of ``event_features`` rows) with ``predict``."""
    from pyspark.sql import functions as F

    return features.select(
        "event_id",
        "device_id",
        "event_time",
        predict(*FEATURES).alias("predicted_type"),
        F.lit(model_id).alias("model_id"),
    )


def arrow_predictor(spark: SparkSession, model: TrainedModel) -> Callable[..., Column]:
    """An Arrow UDF predicting the event kind, with the model broadcast once.

    Defined inside this function so cloudpickle ships it by value: the Python workers need
    not import the ``demo`` package.
    """
    from pyspark.sql.functions import arrow_udf

    broadcast = spark.sparkContext.broadcast(model.blob)

    @arrow_udf("string")
    def predict_event_type(
        batches: Iterator[tuple[pa.Array, pa.Array, pa.Array]],
    ) -> Iterator[pa.Array]:
        # Once per task, not per batch: the iterator form gives the whole partition.
        estimator = pickle.loads(broadcast.value)
        for columns in batches:
            matrix = np.column_stack([c.to_numpy(zero_copy_only=False) for c in columns])
            yield pa.array(estimator.predict(matrix), pa.string())

    return predict_event_type


def _matrix(table: pa.Table) -> np.ndarray[Any, np.dtype[np.float64]]:
    return np.column_stack(
        [table[name].cast(pa.float64()).to_numpy(zero_copy_only=False) for name in FEATURES]
    )


# ---- the summary and its independent checks ---------------------------------------------


def print_summary(
    spark: SparkSession,
    model: TrainedModel,
    scored: int | None,
    tables: str,
    model_path: Path,
) -> dict[str, int]:
    """Print the scoring summary; check each number against the Delta tables read by Arrow."""
    import deltalake

    print(
        f"  event-kind model: scikit-learn decision tree (depth {TREE_DEPTH}), trained on"
        f" {model.training_rows:,} labelled backfill events; model {model.model_id},"
        f" {len(model.blob):,} bytes in {model_path.name}"
    )
    counts = {
        row["predicted_type"]: int(row["count"])
        for row in spark.read.table("fitness.gold_event_kinds")
        .groupBy("predicted_type")
        .count()
        .collect()
    }
    print(f"  rows scored in-stream:     {scored or 0:,}")
    print(f"  held-out accuracy:         {model.accuracy:.2%} of {model.held_out.num_rows:,}")
    print(
        "  predicted kinds:           "
        + ", ".join(f"{kind} {n:,}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    )

    features = deltalake.DeltaTable(f"{tables}/event_features").to_pyarrow_table()
    gold = deltalake.DeltaTable(f"{tables}/gold_event_kinds").to_pyarrow_table()
    saved = model_path.read_bytes()
    check(
        hashlib.sha256(saved).hexdigest()[:12] == model.model_id and len(saved) == len(model.blob),
        f"{model_path} holds {len(saved):,} bytes, not the {len(model.blob):,} of model"
        f" {model.model_id} that was broadcast",
    )
    check(
        model.training_rows + model.held_out.num_rows == min(TRAINING_ROWS, features.num_rows),
        f"{model.training_rows:,} training and {model.held_out.num_rows:,} held-out rows do"
        f" not add up to the labelled slice of {min(TRAINING_ROWS, features.num_rows):,}",
    )
    check(
        scored == features.num_rows == gold.num_rows
        and pc.count_distinct(gold["event_id"]).as_py() == gold.num_rows,
        f"the gold flow wrote {scored} predictions; event_features holds"
        f" {features.num_rows:,} rows and gold_event_kinds {gold.num_rows:,}: expected one"
        " prediction per feature row",
    )
    check(
        set(gold["model_id"].unique().to_pylist()) == {model.model_id},
        f"gold_event_kinds names models {gold['model_id'].unique()}, not {model.model_id}",
    )
    # The model's own predictions, made here in pandas from the saved bytes, row by row.
    scored_rows = gold.select(["event_id", "predicted_type"])
    joined = features.join(scored_rows, "event_id", join_type="inner")
    estimator = pickle.loads(saved)
    frame = joined.to_pandas()
    expected = estimator.predict(frame[list(FEATURES)].to_numpy())
    disagree = int((expected != frame["predicted_type"].to_numpy()).sum())
    check(
        joined.num_rows == gold.num_rows and disagree == 0,
        f"{disagree:,} of {joined.num_rows:,} in-stream predictions differ from the model's",
    )
    held = model.held_out.join(scored_rows, "event_id")
    right = pc.sum(pc.equal(held[LABEL], held["predicted_type"]).cast(pa.int64())).as_py()
    check(
        held.num_rows == model.held_out.num_rows
        and abs(right / max(held.num_rows, 1) - model.accuracy) < 1e-12,
        f"the in-stream predictions of the {held.num_rows:,} held-out rows are"
        f" {right / max(held.num_rows, 1):.4%} right; training measured {model.accuracy:.4%}",
    )
    arrow_counts = {
        row["predicted_type"]: row["count_all"]
        for row in gold.group_by("predicted_type").aggregate([([], "count_all")]).to_pylist()
    }
    check(
        counts == arrow_counts,
        f"Spark counts the predicted kinds {counts}; the Delta table read by Arrow {arrow_counts}",
    )
    print("  OK: one prediction per feature row, each the model's own, accuracy and counts agree")
    return counts
