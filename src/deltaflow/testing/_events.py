"""Synthetic IoT events: fitness trackers that report once a second.

The stream is a pure function of ``(seed, devices, start, events_per_second)``: event number
``k`` is the same whichever batch sizes you ask for, so ``batch(100)`` twice equals
``batch(200)`` once. Events are generated in fixed-size blocks, each from its own random
stream keyed by ``(seed, block number)``, which keeps that promise without replaying
earlier blocks.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltaflow.testing._states import STATES

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# Event types and how often each occurs.
EVENT_TYPES: tuple[str, ...] = (
    "heartbeat",
    "step",
    "workout_start",
    "workout_end",
    "sleep",
    "battery_low",
    "fall_detected",
)
EVENT_TYPE_WEIGHTS: tuple[float, ...] = (0.800, 0.150, 0.015, 0.015, 0.015, 0.004, 0.001)

DEVICE_EVENT_SCHEMA = pa.schema(
    [
        pa.field("event_id", pa.string(), nullable=False),
        pa.field("device_id", pa.string(), nullable=False),
        pa.field("user_id", pa.string(), nullable=False),
        pa.field("state", pa.string(), nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("latitude", pa.float64(), nullable=False),
        pa.field("longitude", pa.float64(), nullable=False),
        # Null while the tracker is off the wrist.
        pa.field("heart_rate", pa.int32(), nullable=True),
        pa.field("steps", pa.int32(), nullable=False),
        pa.field("battery_pct", pa.int32(), nullable=False),
        pa.field("event_time", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("event_date", pa.date32(), nullable=False),
    ]
)

# The same schema as a Spark DDL string, for ``spark.createDataFrame(..., schema=...)`` or
# ``readStream.schema(...)``.
DEVICE_EVENT_DDL = (
    "event_id STRING NOT NULL, device_id STRING NOT NULL, user_id STRING NOT NULL, "
    "state STRING NOT NULL, event_type STRING NOT NULL, latitude DOUBLE NOT NULL, "
    "longitude DOUBLE NOT NULL, heart_rate INT, steps INT NOT NULL, "
    "battery_pct INT NOT NULL, event_time TIMESTAMP NOT NULL, event_date DATE NOT NULL"
)

DEFAULT_START = datetime(2025, 6, 1, tzinfo=timezone.utc)

# Rows per generation block. Large enough that numpy's per-call overhead vanishes, small
# enough that a block (about 10 MB of Arrow) is cheap to regenerate.
_BLOCK_ROWS = 1 << 16
_OFF_WRIST_PROBABILITY = 0.03
_SECOND_DEVICE_SHARE = 0.1  # users who own two trackers
_BATTERY_DRAIN_PCT_PER_HOUR = 4.0
_POSITION_NOISE_DEGREES = 0.01  # a few hundred metres of walking about
_EVENT_ID_DIGITS = 12
_US_PER_SECOND = 1_000_000


class DeviceEventGenerator:
    """A deterministic stream of fitness-tracker events, in event-time order.

    ``devices`` trackers, each worn by a user who lives in one state (states weighted by
    population, so CA, TX, FL and NY are the most common), report ``events_per_second``
    events in total; by default every device reports once a second, with up to one
    event-interval of jitter. Timestamps are UTC and never decrease.

    >>> gen = DeviceEventGenerator(seed=7, devices=100)
    >>> first = gen.batch(1_000)          # events 0..999
    >>> more = list(gen.batches(3, 500))  # events 1000..2499, in 3 tables
    """

    def __init__(
        self,
        seed: int = 0,
        devices: int = 1000,
        start: datetime = DEFAULT_START,
        events_per_second: float | None = None,
    ) -> None:
        if seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {seed}")
        if devices < 1:
            raise ValueError(f"devices must be at least 1, got {devices}")
        if events_per_second is not None and events_per_second <= 0:
            raise ValueError(f"events_per_second must be positive, got {events_per_second}")
        if start.tzinfo is None:
            start = start.replace(tzinfo=timezone.utc)
        self.seed = seed
        self.devices = devices
        self.start = start.astimezone(timezone.utc)
        self.events_per_second = float(events_per_second or devices)
        self._position = 0
        self._start_us = _epoch_micros(self.start)
        self._cached_block: tuple[int, pa.Table] | None = None
        self._fleet = _Fleet.build(seed, devices)
        self._id_prefix = "evt-" + hashlib.sha256(str(seed).encode()).hexdigest()[:8] + "-"

    @property
    def schema(self) -> pa.Schema:
        """The Arrow schema of every batch."""
        return DEVICE_EVENT_SCHEMA

    @property
    def spark_schema(self) -> str:
        """The schema as a Spark DDL string."""
        return DEVICE_EVENT_DDL

    @property
    def position(self) -> int:
        """How many events have been handed out so far."""
        return self._position

    def batch(self, n: int) -> pa.Table:
        """The next ``n`` events, in event-time order."""
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        pieces: list[pa.Table] = []
        remaining = n
        while remaining > 0:
            block_no, offset = divmod(self._position, _BLOCK_ROWS)
            take = min(remaining, _BLOCK_ROWS - offset)
            pieces.append(self._block(block_no).slice(offset, take))
            self._position += take
            remaining -= take
        if not pieces:
            return DEVICE_EVENT_SCHEMA.empty_table()
        return pa.concat_tables(pieces)

    def batches(self, n_batches: int, rows: int) -> Iterator[pa.Table]:
        """``n_batches`` consecutive tables of ``rows`` events each."""
        for _ in range(n_batches):
            yield self.batch(rows)

    def time_of(self, event_number: int) -> datetime:
        """The earliest time event number ``event_number`` (0-based) can carry."""
        offset = math.floor(event_number * (_US_PER_SECOND / self.events_per_second))
        return self.start + timedelta(microseconds=offset)

    def _block(self, block_no: int) -> pa.Table:
        if self._cached_block is None or self._cached_block[0] != block_no:
            self._cached_block = (block_no, self._generate_block(block_no))
        return self._cached_block[1]

    def _generate_block(self, block_no: int) -> pa.Table:
        rng = np.random.default_rng([self.seed, block_no + 1])
        n = _BLOCK_ROWS
        k = np.arange(block_no * n, (block_no + 1) * n, dtype=np.int64)
        fleet = self._fleet

        # Each device keeps its own phase within the reporting cycle, so device order repeats
        # cycle after cycle; jitter stays below one event interval, so times never go back.
        device = fleet.cycle_order[k % self.devices]
        event_us = self._start_us + np.floor(
            (k + rng.random(n)) * (_US_PER_SECOND / self.events_per_second)
        ).astype(np.int64)

        type_index = rng.choice(len(EVENT_TYPES), size=n, p=_EVENT_TYPE_P)
        heart_rate = _heart_rates(rng, type_index)
        off_wrist = rng.random(n) < _OFF_WRIST_PROBABILITY
        steps = np.where(type_index == _STEP, rng.poisson(1.7, n) + 1, rng.poisson(0.05, n)).astype(
            np.int32
        )

        elapsed_hours = (event_us - self._start_us) / (3600 * _US_PER_SECOND)
        charge = (fleet.battery_start[device] - elapsed_hours * _BATTERY_DRAIN_PCT_PER_HOUR) % 100
        battery = np.clip(np.ceil(charge), 1, 100).astype(np.int32)
        low = type_index == _BATTERY_LOW
        battery[low] = rng.integers(1, 16, int(low.sum()), dtype=np.int32)

        state = fleet.state_index[device]
        lat = fleet.home_lat[device] + rng.normal(0, _POSITION_NOISE_DEGREES, n)
        lon = fleet.home_lon[device] + rng.normal(0, _POSITION_NOISE_DEGREES, n)
        lat = np.clip(lat, _LAT_MIN[state], _LAT_MAX[state])
        lon = np.clip(lon, _LON_MIN[state], _LON_MAX[state])

        event_time = pa.array(event_us, type=pa.timestamp("us", tz="UTC"))
        columns: list[Any] = [
            _fixed_width_strings(self._id_prefix, k, _EVENT_ID_DIGITS),
            fleet.device_ids.take(pa.array(device)),
            fleet.user_ids.take(pa.array(fleet.user_of[device])),
            _STATE_CODES.take(pa.array(state)),
            _EVENT_TYPE_NAMES.take(pa.array(type_index)),
            pa.array(lat),
            pa.array(lon),
            pa.array(heart_rate, mask=off_wrist),
            pa.array(steps),
            pa.array(battery),
            event_time,
            pc.cast(event_time, pa.date32()),
        ]
        return pa.Table.from_arrays(columns, schema=DEVICE_EVENT_SCHEMA)


def to_spark(spark: SparkSession, table: pa.Table) -> DataFrame:
    """A Spark DataFrame over an Arrow ``table`` (e.g. a generator batch), via Arrow.

    Goes through ``spark.createDataFrame(pyarrow.Table)``, which skips pandas entirely.
    Columns keep their Arrow types (``timestamp[us, UTC]`` becomes ``TIMESTAMP``).
    """
    return spark.createDataFrame(table)


class _Fleet:
    """Per-device facts fixed for the generator's lifetime: owner, home, battery."""

    def __init__(
        self,
        device_ids: pa.Array,
        user_ids: pa.Array,
        user_of: np.ndarray[Any, np.dtype[np.int64]],
        state_index: np.ndarray[Any, np.dtype[np.int64]],
        home_lat: np.ndarray[Any, np.dtype[np.float64]],
        home_lon: np.ndarray[Any, np.dtype[np.float64]],
        battery_start: np.ndarray[Any, np.dtype[np.float64]],
        cycle_order: np.ndarray[Any, np.dtype[np.int64]],
    ) -> None:
        self.device_ids = device_ids
        self.user_ids = user_ids
        self.user_of = user_of
        self.state_index = state_index
        self.home_lat = home_lat
        self.home_lon = home_lon
        self.battery_start = battery_start
        self.cycle_order = cycle_order

    @classmethod
    def build(cls, seed: int, devices: int) -> _Fleet:
        rng = np.random.default_rng([seed, 0])
        users = max(1, round(devices / (1 + _SECOND_DEVICE_SHARE)))
        user_state = rng.choice(len(STATES), size=users, p=_STATE_P)
        # Homes sit inside the middle 90% of the box, so position noise rarely needs clipping.
        lat_u, lon_u = rng.uniform(0.05, 0.95, users), rng.uniform(0.05, 0.95, users)
        user_lat = _LAT_MIN[user_state] + lat_u * (_LAT_MAX - _LAT_MIN)[user_state]
        user_lon = _LON_MIN[user_state] + lon_u * (_LON_MAX - _LON_MIN)[user_state]

        # The first `users` devices are each user's first tracker; the rest are second ones.
        user_of = np.concatenate(
            [np.arange(users), rng.integers(0, users, devices - users)]
        ).astype(np.int64)
        # User numbers are sparse and shuffled, so user ids don't line up with device ids.
        user_pool = max(users * 10, 1000)
        user_numbers = rng.permutation(user_pool)[:users].astype(np.int64)
        return cls(
            device_ids=_fixed_width_strings(
                "dev-", np.arange(devices, dtype=np.int64), max(6, len(str(devices - 1)))
            ),
            user_ids=_fixed_width_strings("usr-", user_numbers, max(7, len(str(user_pool - 1)))),
            user_of=user_of,
            state_index=user_state[user_of].astype(np.int64),
            home_lat=user_lat[user_of],
            home_lon=user_lon[user_of],
            battery_start=rng.uniform(20, 100, devices),
            cycle_order=rng.permutation(devices).astype(np.int64),
        )


def _heart_rates(
    rng: np.random.Generator, type_index: np.ndarray[Any, np.dtype[np.int64]]
) -> np.ndarray[Any, np.dtype[np.int32]]:
    mean = _HEART_RATE_MEAN[type_index]
    rates = rng.normal(mean, 0.12 * mean)
    clipped: np.ndarray[Any, np.dtype[np.int32]] = np.clip(np.rint(rates), 35, 210).astype(np.int32)
    return clipped


def _fixed_width_strings(
    prefix: str, numbers: np.ndarray[Any, np.dtype[np.int64]], digits: int
) -> pa.Array:
    """``prefix`` + zero-padded ``numbers`` as an Arrow string array, built without Python loops."""
    head = np.frombuffer(prefix.encode("ascii"), dtype=np.uint8)
    powers = 10 ** np.arange(digits - 1, -1, -1, dtype=np.int64)
    tail = ((numbers[:, None] // powers) % 10 + ord("0")).astype(np.uint8)
    width = head.size + digits
    data = np.empty((numbers.size, width), dtype=np.uint8)
    data[:, : head.size] = head
    data[:, head.size :] = tail
    offsets = np.arange(numbers.size + 1, dtype=np.int32) * width
    return pa.StringArray.from_buffers(
        numbers.size, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())
    )


def _epoch_micros(moment: datetime) -> int:
    delta = moment - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * _US_PER_SECOND + delta.microseconds


_STATE_CODES = pa.array([state.code for state in STATES])
_STATE_P = np.array([state.weight for state in STATES]) / sum(state.weight for state in STATES)
_LAT_MIN = np.array([state.lat_min for state in STATES])
_LAT_MAX = np.array([state.lat_max for state in STATES])
_LON_MIN = np.array([state.lon_min for state in STATES])
_LON_MAX = np.array([state.lon_max for state in STATES])
_EVENT_TYPE_NAMES = pa.array(EVENT_TYPES)
_EVENT_TYPE_P = np.array(EVENT_TYPE_WEIGHTS) / sum(EVENT_TYPE_WEIGHTS)
_STEP = EVENT_TYPES.index("step")
_BATTERY_LOW = EVENT_TYPES.index("battery_low")
# Resting, walking, workout start/end, asleep, battery_low and fall_detected (alarm).
_HEART_RATE_MEAN = np.array([72.0, 95.0, 110.0, 145.0, 56.0, 72.0, 120.0])
