"""DeviceEventGenerator: deterministic, ordered, plausible events. Pure Python, no Spark."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from deltaflow.testing import (
    DEVICE_EVENT_DDL,
    DEVICE_EVENT_SCHEMA,
    EVENT_TYPE_WEIGHTS,
    EVENT_TYPES,
    STATE_BOXES,
    STATES,
    DeviceEventGenerator,
)

START = datetime(2025, 6, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def events() -> pa.Table:
    """200k events from 5000 devices: 40 seconds of data."""
    return DeviceEventGenerator(seed=3, devices=5000, start=START).batch(200_000)


def test_same_seed_same_events():
    first = DeviceEventGenerator(seed=11, devices=200).batch(150_000)
    second = DeviceEventGenerator(seed=11, devices=200).batch(150_000)
    assert first.equals(second)


def test_different_seeds_differ():
    first = DeviceEventGenerator(seed=1, devices=200).batch(1_000)
    second = DeviceEventGenerator(seed=2, devices=200).batch(1_000)
    assert not first.equals(second)
    assert set(first["event_id"].to_pylist()).isdisjoint(second["event_id"].to_pylist())


def test_batch_sizes_do_not_change_the_stream():
    whole = DeviceEventGenerator(seed=5, devices=300).batch(140_000)
    gen = DeviceEventGenerator(seed=5, devices=300)
    pieces = [gen.batch(n) for n in (1, 0, 65_535, 70_000, 4_464)]
    assert pa.concat_tables(pieces).equals(whole)
    assert gen.position == 140_000


def test_batches_yields_consecutive_tables():
    gen = DeviceEventGenerator(seed=5, devices=300)
    tables = list(gen.batches(3, 1_000))
    assert [table.num_rows for table in tables] == [1_000, 1_000, 1_000]
    assert pa.concat_tables(tables).equals(DeviceEventGenerator(seed=5, devices=300).batch(3_000))


def test_schema(events):
    gen = DeviceEventGenerator()
    assert events.schema == DEVICE_EVENT_SCHEMA == gen.schema
    assert gen.batch(0).schema == DEVICE_EVENT_SCHEMA
    assert gen.spark_schema == DEVICE_EVENT_DDL
    ddl_columns = [part.strip().split()[0] for part in DEVICE_EVENT_DDL.split(",")]
    assert ddl_columns == DEVICE_EVENT_SCHEMA.names
    assert DEVICE_EVENT_SCHEMA.field("event_time").type == pa.timestamp("us", tz="UTC")
    assert DEVICE_EVENT_SCHEMA.field("event_date").type == pa.date32()
    for name in DEVICE_EVENT_SCHEMA.names:
        if name != "heart_rate":
            assert events[name].null_count == 0, name


def test_time_order_rate_and_start(events):
    micros = events["event_time"].cast(pa.int64()).to_numpy()
    assert (np.diff(micros) >= 0).all()
    first = events["event_time"][0].as_py()
    last = events["event_time"][-1].as_py()
    assert START <= first < START + timedelta(milliseconds=1)
    # 5000 devices reporting once a second: 200k events cover 40 seconds.
    assert timedelta(seconds=39.9) < last - START < timedelta(seconds=40)


def test_each_device_reports_about_once_a_second(events):
    device = events["device_id"].to_numpy(zero_copy_only=False)
    micros = events["event_time"].cast(pa.int64()).to_numpy()
    chosen = device[0]
    gaps = np.diff(micros[device == chosen]) / 1e6
    assert len(gaps) == 39
    assert ((gaps > 0.99) & (gaps < 1.01)).all()


def test_event_date_follows_event_time():
    gen = DeviceEventGenerator(seed=1, devices=100, start=datetime(2025, 1, 1, 23, 59, 30))
    table = gen.batch(6_000)  # one minute, across midnight
    assert table["event_date"].equals(pc.cast(table["event_time"], pa.date32()))
    assert set(table["event_date"].to_pylist()) == {
        datetime(2025, 1, 1).date(),
        datetime(2025, 1, 2).date(),
    }


def test_time_of_is_a_lower_bound():
    gen = DeviceEventGenerator(seed=1, devices=100, start=START)
    table = gen.batch(10_000)
    for k in (0, 1, 999, 9_999):
        assert gen.time_of(k) <= table["event_time"][k].as_py() < gen.time_of(k + 1)


def test_event_ids_are_unique(events):
    ids = events["event_id"]
    assert pc.count_distinct(ids).as_py() == events.num_rows
    assert ids[0].as_py().startswith("evt-")


def test_id_formats(events):
    assert pc.all(pc.match_substring_regex(events["device_id"], r"^dev-\d{6}$")).as_py()
    assert pc.all(pc.match_substring_regex(events["user_id"], r"^usr-\d{7}$")).as_py()
    assert pc.count_distinct(events["device_id"]).as_py() == 5000
    # Some users own two trackers.
    users = pc.count_distinct(events["user_id"]).as_py()
    assert 4000 < users < 5000


def test_a_device_belongs_to_one_user_and_one_state(events):
    pairs = events.group_by("device_id").aggregate(
        [("user_id", "count_distinct"), ("state", "count_distinct")]
    )
    assert pc.max(pairs["user_id_count_distinct"]).as_py() == 1
    assert pc.max(pairs["state_count_distinct"]).as_py() == 1


def test_value_ranges(events):
    def bounds(name: str) -> tuple[int, int]:
        result = pc.min_max(events[name])
        return result["min"].as_py(), result["max"].as_py()

    low, high = bounds("heart_rate")
    assert low >= 35 and high <= 210
    assert 0.01 < events["heart_rate"].null_count / events.num_rows < 0.06
    low, high = bounds("battery_pct")
    assert low >= 1 and high <= 100
    low, high = bounds("steps")
    assert low == 0 and high < 30
    assert set(events["event_type"].to_pylist()) == set(EVENT_TYPES)
    assert set(events["state"].to_pylist()) <= set(STATE_BOXES)


def test_battery_low_events_report_a_low_battery(events):
    low = events.filter(pc.equal(events["event_type"], "battery_low"))
    assert low.num_rows > 0
    assert pc.max(low["battery_pct"]).as_py() <= 15


def test_all_states_and_dc_are_covered():
    assert len(STATES) == 51
    assert "DC" in STATE_BOXES
    table = DeviceEventGenerator(seed=0, devices=20_000).batch(20_000)
    assert set(table["state"].to_pylist()) == set(STATE_BOXES)


def test_state_weights_are_roughly_honoured(events):
    counts = {row["values"]: row["counts"] for row in pc.value_counts(events["state"]).to_pylist()}
    total = sum(state.weight for state in STATES)
    for code in ("CA", "TX", "FL", "NY", "WY", "VT"):
        expected = STATE_BOXES[code].weight / total
        observed = counts.get(code, 0) / events.num_rows
        # 5000 devices: sampling noise is a few tenths of a percent.
        assert abs(observed - expected) < max(0.25 * expected, 0.003), code
    top_four = sorted(counts, key=counts.__getitem__, reverse=True)[:4]
    assert set(top_four) == {"CA", "TX", "FL", "NY"}


def test_event_type_weights_are_roughly_honoured(events):
    counts = {
        row["values"]: row["counts"] for row in pc.value_counts(events["event_type"]).to_pylist()
    }
    for name, weight in zip(EVENT_TYPES, EVENT_TYPE_WEIGHTS, strict=True):
        observed = counts.get(name, 0) / events.num_rows
        assert abs(observed - weight) < max(0.1 * weight, 0.0005), name


def test_positions_lie_inside_the_state_box(events):
    state = events["state"].to_numpy(zero_copy_only=False)
    lat = events["latitude"].to_numpy()
    lon = events["longitude"].to_numpy()
    for code, box in STATE_BOXES.items():
        rows = state == code
        if not rows.any():
            continue
        assert (lat[rows] >= box.lat_min).all() and (lat[rows] <= box.lat_max).all(), code
        assert (lon[rows] >= box.lon_min).all() and (lon[rows] <= box.lon_max).all(), code


def test_naive_start_means_utc():
    naive = DeviceEventGenerator(seed=1, devices=10, start=datetime(2025, 3, 1, 8, 0))
    aware = DeviceEventGenerator(
        seed=1, devices=10, start=datetime(2025, 3, 1, 8, 0, tzinfo=timezone.utc)
    )
    assert naive.batch(100).equals(aware.batch(100))


def test_events_per_second_sets_the_pace():
    gen = DeviceEventGenerator(seed=1, devices=100, start=START, events_per_second=10)
    table = gen.batch(100)  # each device once, over ten seconds
    assert timedelta(seconds=9.8) < table["event_time"][-1].as_py() - START < timedelta(seconds=10)


@pytest.mark.parametrize("kwargs", [{"seed": -1}, {"devices": 0}, {"events_per_second": 0}])
def test_bad_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        DeviceEventGenerator(**kwargs)


def test_a_million_events_is_fast():
    import time

    gen = DeviceEventGenerator(seed=0)
    started = time.perf_counter()
    table = gen.batch(1_000_000)
    elapsed = time.perf_counter() - started
    assert table.num_rows == 1_000_000
    assert elapsed < 5, f"1M events took {elapsed:.2f}s"


def test_import_has_no_side_effects():
    code = "import sys, deltaflow.testing; assert 'pyspark' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
