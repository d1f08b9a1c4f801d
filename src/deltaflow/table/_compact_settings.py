"""Auto compaction's settings: delta-spark's session confs and table properties, read
and checked (bad values are typed errors), and who turns it on (:func:`enabled_for`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from deltaflow.errors import InvalidOptionError

log = logging.getLogger("deltaflow.table._auto_compact")

# delta-spark's table properties and session settings (DeltaConfigs, DeltaSQLConf).
TABLE_PROPERTY = "delta.autoOptimize.autoCompact"
LEGACY_TABLE_PROPERTY = "delta.autoOptimize"
ENABLED_CONF = "spark.databricks.delta.autoCompact.enabled"
MIN_NUM_FILES_CONF = "spark.databricks.delta.autoCompact.minNumFiles"
MAX_FILE_SIZE_CONF = "spark.databricks.delta.autoCompact.maxFileSize"
MIN_FILE_SIZE_CONF = "spark.databricks.delta.autoCompact.minFileSize"
MAX_PARTITIONS_CONF = "spark.databricks.delta.autoCompact.maxNumModifiedPartitions"
# deltaflow's own: run the compaction on a background thread instead of inside the commit.
BACKGROUND_CONF = "spark.deltaflow.autoCompact.background"
SESSION_CONFS = (
    ENABLED_CONF,
    MIN_NUM_FILES_CONF,
    MAX_FILE_SIZE_CONF,
    MIN_FILE_SIZE_CONF,
    MAX_PARTITIONS_CONF,
    BACKGROUND_CONF,
)

DEFAULT_MIN_NUM_FILES = 50
# deltaflow's threshold when a stream's table is compacted by the stream default alone
# (minNumFiles not set): a micro-batch's files are tiny, so rewriting ten of them costs
# little, and a stream that stops leaves at most nine small files per partition behind.
STREAM_MIN_NUM_FILES = 10
DEFAULT_MAX_FILE_SIZE = 128 * 1024 * 1024
DEFAULT_MAX_PARTITIONS = 128
# Property values that turn it on: delta-spark's "true"; Databricks' "auto" (it tunes the
# target size; deltaflow uses maxFileSize) and "legacy" (an alias of "true").
_ON_VALUES = ("true", "auto", "legacy")


@dataclass(frozen=True)
class AutoCompactSettings:
    """The writer's session settings; the table's property decides when ``enabled`` is None."""

    enabled: bool | None = None
    min_num_files: int = DEFAULT_MIN_NUM_FILES
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    min_file_size: int | None = None  # None: half of max_file_size, as delta-spark
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    background: bool = False
    # The writer is a stream (a micro-batch or real-time sink, HTTP ingest): its many small
    # commits make small files, so compaction is on unless the session or the table says
    # otherwise, and runs in the background so the stream never waits for it.
    stream: bool = False

    @property
    def small_file_size(self) -> int:
        return self.min_file_size if self.min_file_size is not None else self.max_file_size // 2

    @classmethod
    def from_conf(cls, conf: Mapping[str, str | None]) -> AutoCompactSettings:
        """Settings from Spark conf keys (any case); bad values raise InvalidOptionError."""
        wanted = {k.lower(): k for k in SESSION_CONFS}
        given = {wanted[k.lower()]: v.strip() for k, v in conf.items() if k.lower() in wanted and v}
        settings = cls()
        if ENABLED_CONF in given:
            settings = replace(settings, enabled=_enabled(given[ENABLED_CONF], ENABLED_CONF))
        if BACKGROUND_CONF in given:
            settings = replace(settings, background=_flag(given[BACKGROUND_CONF], BACKGROUND_CONF))
        counts: dict[str, Any] = {
            name: _count(given[key], key)
            for key, name in (
                (MIN_NUM_FILES_CONF, "min_num_files"),
                (MAX_FILE_SIZE_CONF, "max_file_size"),
                (MIN_FILE_SIZE_CONF, "min_file_size"),
                (MAX_PARTITIONS_CONF, "max_partitions"),
            )
            if key in given
        }
        return replace(settings, **counts)

    def to_conf(self) -> dict[str, str]:
        """The settings that differ from the defaults, as Spark conf keys."""
        out: dict[str, str] = {}
        if self.enabled is not None:
            out[ENABLED_CONF] = str(self.enabled).lower()
        if self.background:
            out[BACKGROUND_CONF] = "true"
        for key, value, default in (
            (MIN_NUM_FILES_CONF, self.min_num_files, DEFAULT_MIN_NUM_FILES),
            (MAX_FILE_SIZE_CONF, self.max_file_size, DEFAULT_MAX_FILE_SIZE),
            (MIN_FILE_SIZE_CONF, self.min_file_size, None),
            (MAX_PARTITIONS_CONF, self.max_partitions, DEFAULT_MAX_PARTITIONS),
        ):
            if value != default:
                out[key] = str(value)
        return out


DEFAULT_SETTINGS = AutoCompactSettings()


def _enabled(raw: str, key: str) -> bool:
    value = raw.lower()
    if value in _ON_VALUES:
        return True
    if value == "false":
        return False
    raise InvalidOptionError(
        f"{key} must be one of true, false, auto, legacy; got {raw!r}.",
        option=key,
        valid=(*_ON_VALUES, "false"),
    )


def _flag(raw: str, key: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise InvalidOptionError(
            f"{key} must be 'true' or 'false', got {raw!r}.", option=key, valid=("true", "false")
        )
    return raw.lower() == "true"


def _count(raw: str, key: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0 or (value == 0 and key in (MAX_FILE_SIZE_CONF, MAX_PARTITIONS_CONF)):
        raise InvalidOptionError(
            f"{key} must be a whole number above 0 (bytes for sizes), got {raw!r}.", option=key
        )
    return value


def enabled_for(settings: AutoCompactSettings, configuration: Mapping[str, str | None]) -> bool:
    """delta-spark's precedence: the session setting, then the legacy ``delta.autoOptimize``,
    then ``delta.autoOptimize.autoCompact``; when none is set, off for batch writers and
    on for streams (deltaflow's default: a stream's table stays healthy by itself)."""
    if settings.enabled is not None:
        return settings.enabled
    lowered = {k.lower(): (v or "").strip().lower() for k, v in configuration.items()}
    legacy = lowered.get(LEGACY_TABLE_PROPERTY.lower(), "")
    if legacy == "true":
        return True
    value = lowered.get(TABLE_PROPERTY.lower(), "")
    if value and value not in (*_ON_VALUES, "false"):
        log.warning("ignoring %s=%r: it takes true, false, auto, legacy", TABLE_PROPERTY, value)
        value = ""
    if not value and not legacy:
        return settings.stream
    return value in _ON_VALUES


def asked_for(configuration: Mapping[str, str | None]) -> bool:
    """Whether the table's properties turn auto compaction on themselves."""
    return enabled_for(AutoCompactSettings(), configuration)
