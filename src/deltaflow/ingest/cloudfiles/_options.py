"""The ``cloudFiles`` source's options: parsed once, frozen, unknown keys rejected."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from deltaflow.errors import InvalidOptionError
from deltaflow.table import _uri

Format = Literal["json", "csv", "parquet", "text"]
EvolutionMode = Literal["addNewColumns", "rescue", "failOnNewColumns", "none"]

FORMATS: tuple[str, ...] = ("json", "csv", "parquet", "text")
TEXT_VALUE_COLUMN = "value"  # format text: one string column, as spark.read.text
EVOLUTION_MODES: tuple[str, ...] = ("addNewColumns", "rescue", "failOnNewColumns", "none")
RESCUED_DATA_COLUMN = "_rescued_data"
METADATA_COLUMN = "_metadata"

# Keys compared in lower case (Spark's options are case-insensitive).
_KNOWN = (
    "path",
    "cloudFiles.format",
    "cloudFiles.schemaLocation",
    "cloudFiles.inferColumnTypes",
    "cloudFiles.schemaHints",
    "cloudFiles.schemaEvolutionMode",
    "cloudFiles.includeExistingFiles",
    "cloudFiles.maxFilesPerTrigger",
    "cloudFiles.maxBytesPerTrigger",
    "cloudFiles.allowOverwrites",
    "cloudFiles.includeFileMetadata",
    "cloudFiles.recheckWindowSeconds",
    "cloudFiles.sampleFiles",
    "pathGlobFilter",
    "rescuedDataColumn",
    "header",
    "wholeText",
)


@dataclass(frozen=True, kw_only=True)
class CloudFilesOptions:
    path: str  # the landing zone, as a URI
    format: Format
    schema_location: str  # URI; holds _schemas/ and the seen-file store
    infer_column_types: bool
    schema_hints: str
    evolution_mode: EvolutionMode
    include_existing_files: bool
    max_files_per_trigger: int
    max_bytes_per_trigger: int | None
    allow_overwrites: bool
    include_file_metadata: bool
    # Files whose arrival time is this much older than the newest file seen are
    # assumed to be known already and are not looked up again. Large enough to cover
    # clock skew between writers and a slow rename; a file renamed in after that is
    # missed, so the default errs on the side of more look-ups.
    recheck_window_seconds: float
    sample_files: int
    path_glob_filter: str | None
    rescued_data_column: str | None  # None: evolution mode "none" without the option
    header: bool
    whole_text: bool  # format text: one row per file instead of one per line


def parse_options(raw: Mapping[str, str]) -> CloudFilesOptions:
    options = {k.lower(): v for k, v in raw.items()}
    known = {k.lower(): k for k in _KNOWN}
    for key in options:
        if key not in known and (key.startswith("cloudfiles.") or key.startswith("deltaflow.")):
            raise InvalidOptionError(
                f"Unknown cloudFiles option {key!r}. Valid options: {', '.join(_KNOWN)}.",
                option=key,
                valid=_KNOWN,
            )
    path = options.get("path")
    if not path:
        raise InvalidOptionError(
            "The cloudFiles source needs the landing-zone path: .load('/path/to/landing').",
            option="path",
        )
    fmt = options.get("cloudfiles.format", "").lower()
    if fmt not in FORMATS:
        raise InvalidOptionError(
            f"cloudFiles.format must be one of {', '.join(FORMATS)} (got {fmt!r}); e.g."
            " .option('cloudFiles.format', 'json').",
            option="cloudFiles.format",
            valid=FORMATS,
        )
    schema_location = options.get("cloudfiles.schemalocation")
    if not schema_location:
        raise InvalidOptionError(
            "The cloudFiles source needs .option('cloudFiles.schemaLocation', '<dir>'): it"
            " keeps the inferred schema's versions and the record of files already read"
            " there (one directory per stream), even when you give a schema.",
            option="cloudFiles.schemaLocation",
        )
    schema_location = _uri.normalize_uri(schema_location)
    if not _uri.is_local(schema_location):
        # The seen-file store is SQLite (transactions, indexed look-ups), which needs a
        # file system with POSIX locks; the landing zone itself may be on an object store.
        raise InvalidOptionError(
            f"cloudFiles.schemaLocation {_uri.shown(schema_location)} is not a local"
            " path: deltaflow keeps the record of files already read there in a SQLite"
            " database, which an object store cannot hold. Give a local or mounted"
            " directory that outlives the stream (beside its checkpointLocation, one per"
            " stream), e.g. .option('cloudFiles.schemaLocation',"
            " '/var/lib/deltaflow/streams/events/schema'); the landing zone and the target"
            " table may stay on the object store.",
            option="cloudFiles.schemaLocation",
        )
    mode = _choice(options, "cloudFiles.schemaEvolutionMode", EVOLUTION_MODES, "addNewColumns")
    rescued = options.get("rescueddatacolumn")
    if rescued is None and mode != "none" and fmt != "text":
        rescued = RESCUED_DATA_COLUMN  # text has nothing to rescue: every line is a value
    return CloudFilesOptions(
        path=_uri.normalize_uri(path),
        format=cast(Format, fmt),
        schema_location=schema_location,
        infer_column_types=_bool(options, "cloudFiles.inferColumnTypes", fmt == "parquet"),
        schema_hints=options.get("cloudfiles.schemahints", ""),
        evolution_mode=cast(EvolutionMode, mode),
        include_existing_files=_bool(options, "cloudFiles.includeExistingFiles", True),
        max_files_per_trigger=_int(options, "cloudFiles.maxFilesPerTrigger", 1000),
        max_bytes_per_trigger=_bytes(options, "cloudFiles.maxBytesPerTrigger"),
        allow_overwrites=_bool(options, "cloudFiles.allowOverwrites", False),
        include_file_metadata=_bool(options, "cloudFiles.includeFileMetadata", False),
        recheck_window_seconds=float(options.get("cloudfiles.recheckwindowseconds", "3600")),
        sample_files=_int(options, "cloudFiles.sampleFiles", 50),
        path_glob_filter=options.get("pathglobfilter"),
        rescued_data_column=rescued,
        header=_bool(options, "header", True),
        whole_text=_bool(options, "wholeText", False),
    )


def _choice(options: Mapping[str, str], key: str, valid: tuple[str, ...], default: str) -> str:
    value = options.get(key.lower(), default)
    for choice in valid:
        if choice.lower() == value.lower():
            return choice
    raise InvalidOptionError(
        f"{key} must be one of {', '.join(valid)} (got {value!r}).", option=key, valid=valid
    )


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    value = options.get(key.lower())
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidOptionError(
        f"{key} must be true or false (got {value!r}).", option=key, valid=("true", "false")
    )


def _int(options: Mapping[str, str], key: str, default: int) -> int:
    value = options.get(key.lower())
    if value is None:
        return default
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number <= 0:
        raise InvalidOptionError(f"{key} must be a positive integer (got {value!r}).", option=key)
    return number


_UNITS = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def _bytes(options: Mapping[str, str], key: str) -> int | None:
    value = options.get(key.lower())
    if value is None:
        return None
    text = value.strip().lower().removesuffix("b") or "0"
    unit = _UNITS.get(text[-1], 1) if text[-1].isalpha() else 1
    try:
        number = int(float(text.rstrip("kmgt")) * unit)
    except ValueError:
        number = 0
    if number <= 0:
        raise InvalidOptionError(
            f"{key} must be a positive size such as 10g or 512m (got {value!r}).", option=key
        )
    return number
