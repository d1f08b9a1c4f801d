"""The main demo job runs end to end on a small data set and its answer is right."""

from __future__ import annotations

import hashlib
import pickle
import re

import deltalake
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from demo import _declared, main_job

from deltaflow import pipelines as dp
from deltaflow.testing import DeviceEventGenerator, to_spark

pytestmark = pytest.mark.slow


def _printed_number(label: str, text: str) -> int:
    match = re.search(rf"^\s*{re.escape(label)}:\s+([\d,]+)\s*$", text, re.MULTILINE)
    assert match, f"no '{label}' line in the demo's output:\n{text}"
    return int(match.group(1).replace(",", ""))


def test_demo_answers_correctly(spark, tmp_path, capsys):
    data_dir = tmp_path / "demo"
    argv = [
        "--data-dir",
        str(data_dir),
        "--commits",
        "3",
        "--events-per-commit",
        "20000",
        # 30 s of live events are 150 s of event time: enough for the first live minute
        # to pass gold's one-minute watermark.
        "--live-seconds",
        "30",
    ]

    assert main_job.main(argv, spark=spark) == 0

    out = capsys.readouterr().out
    spark_answer = _printed_number("Spark SQL answer", out)
    arrow_answer = _printed_number("Arrow cross-check", out)
    assert spark_answer == arrow_answer

    # A third computation, independent of the demo's own code path.
    generator = DeviceEventGenerator(seed=0, devices=1000, start=main_job.START)
    low, high = main_job.question_window(generator.start, generator.time_of(60_000))
    events = generator.batch(60_000)
    rows = events.filter(
        pc.and_(
            pc.and_(
                pc.equal(events["event_type"], "workout_start"), pc.equal(events["state"], "CA")
            ),
            pc.and_(
                pc.greater_equal(events["event_time"], pa.scalar(low, events["event_time"].type)),
                pc.less(events["event_time"], pa.scalar(high, events["event_time"].type)),
            ),
        )
    )
    assert spark_answer == rows.num_rows > 10

    assert "SELECT count(*)" in out
    assert re.search(r'versionAsOf", 1\):\s+40,000 rows', out)
    assert re.search(r"\(latest\):\s+60,000 rows", out)
    history = re.findall(r"^\s+(\d+)\s+\S+ \S+\s+(WRITE|CREATE TABLE)\s+([\d,]+)$", out, re.M)
    assert [(int(v), added) for v, _, added in history] == [
        (2, "20,000"),
        (1, "20,000"),
        (0, "20,000"),
    ]
    assert (data_dir / "bronze" / "device_events" / "_delta_log").is_dir()
    # The live part and the registry check their own numbers against independent
    # computations and fail the demo (exit 1) when one disagrees; each prints its OK line.
    for verdict in (
        "OK: every acknowledged event is in bronze exactly once",
        "OK: silver holds each valid event once",
        "OK: gold equals silver's counts in every closed minute",
        "OK: the change feed shows exactly the devices the second round changed or added",
        "OK: expectations, silver, gold and the SCD 2 history agree with the raw data",
        "OK: one prediction per feature row, each the model's own, accuracy and counts agree",
    ):
        assert verdict in out
    _assert_in_stream_predictions_are_the_models(data_dir, out)


def test_declared_stage_scores_the_model_in_stream(spark, tmp_path, capsys):
    """Stage 5 alone, on a small backfill: it does not wait on the live stage's minutes."""
    bronze_uri = (tmp_path / "bronze").as_uri()
    generator = DeviceEventGenerator(seed=0, devices=1000, start=main_job.START)
    for _ in range(2):
        to_spark(spark, generator.batch(15_000)).write.format("delta").mode("append").save(
            bronze_uri
        )
    _declared.run_declared(spark, tmp_path, bronze_uri)

    _assert_in_stream_predictions_are_the_models(tmp_path, capsys.readouterr().out)


def _assert_in_stream_predictions_are_the_models(data_dir, out):
    """gold_event_kinds: one prediction per feature row, each what the saved model predicts."""
    tables = data_dir / "pipeline" / "tables"
    features = deltalake.DeltaTable(str(tables / "event_features")).to_pandas()
    gold = deltalake.DeltaTable(str(tables / "gold_event_kinds")).to_pandas()
    assert len(features) > 20_000
    assert len(gold) == len(features) == gold["event_id"].nunique()
    assert set(gold["event_id"]) == set(features["event_id"])

    blob = (data_dir / "models" / "event_kind.pkl").read_bytes()
    assert set(gold["model_id"]) == {hashlib.sha256(blob).hexdigest()[:12]}
    model = pickle.loads(blob)
    rows = features.merge(gold[["event_id", "predicted_type"]], on="event_id")
    expected = model.predict(rows[["heart_rate", "steps", "battery_pct"]].to_numpy())
    assert (expected == rows["predicted_type"].to_numpy()).all()
    # A model worth having: most kinds right, and more than one kind predicted.
    assert (rows["predicted_type"] == rows["event_type"]).mean() > 0.9
    assert rows["predicted_type"].nunique() > 2
    assert _printed_number("rows scored in-stream", out) == len(gold)

    completed = [
        event["details"]["flow_progress"]
        for event in dp.read_events(str(data_dir / "pipeline" / "system" / "events"))
        if event["event_type"] == "flow_progress"
        and event["origin"]["flow_name"] == "gold_event_kinds"
        and event["details"]["flow_progress"]["status"] == "COMPLETED"
    ]
    assert [p["metrics"]["num_output_rows"] for p in completed] == [len(gold)]


def test_demo_reruns_in_its_own_data_dir_but_refuses_a_foreign_one(tmp_path, capsys):
    ours = tmp_path / "ours"
    main_job.prepare_data_dir(ours)
    (ours / "leftover").write_text("x")
    main_job.prepare_data_dir(ours)  # a directory an earlier run made: wiped
    assert not (ours / "leftover").exists()

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "precious.txt").write_text("keep me")
    assert main_job.main(["--data-dir", str(foreign)]) == 2
    assert (foreign / "precious.txt").read_text() == "keep me"
    assert "refusing to wipe" in capsys.readouterr().err
