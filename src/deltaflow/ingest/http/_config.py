"""Configuration of ``deltaflow serve``: a TOML file plus command-line overrides.

The file::

    [server]
    host = "127.0.0.1"
    port = 8080

    [tables.events]
    path = "/lake/bronze/events"
    schema = "id BIGINT, kind STRING, ts TIMESTAMP"
    tokens_env = "EVENTS_TOKENS"

Every key is listed in ``SERVER_KEYS`` / ``TABLE_KEYS``; unknown keys are refused with
the list of valid ones. Tokens are read here and nowhere else: from the environment
variable a table names (comma-separated tokens) and/or a file (one token per line).
They are kept in :class:`Tokens`, whose ``repr`` never shows them.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from deltaflow.ingest.http.errors import ServeConfigError
from deltaflow.table import _uri

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# Table names become URL path segments and metric labels: a closed, boring alphabet.
TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")

SERVER_KEYS = (
    "host",
    "port",
    "max_body_bytes",
    "max_event_bytes",
    "max_pending_bytes",
    "group_commit_max_delay_ms",
    "group_commit_max_rows",
    "group_commit_max_bytes",
    "idempotency_max_keys",
    "idempotency_recover_commits",
    "fsync",
    "log_level",
)
TABLE_KEYS = (
    "path",
    "schema",
    "create",
    "partition_by",
    "unknown_fields",
    "tokens_env",
    "tokens_file",
    "allow_anonymous",
)
UnknownFields = Literal["reject", "rescue"]
RESCUED_DATA_COLUMN = "_rescued_data"


class Tokens:
    """Bearer tokens of one table. Compared in constant time; never printed."""

    __slots__ = ("_values",)

    def __init__(self, values: tuple[bytes, ...]) -> None:
        self._values = values

    def __repr__(self) -> str:
        return f"Tokens(<{len(self._values)} hidden>)"

    def __len__(self) -> int:
        return len(self._values)

    def accepts(self, presented: bytes) -> bool:
        # Check every token so timing does not tell which one (or how many) matched.
        found = False
        for value in self._values:
            found |= hmac.compare_digest(value, presented)
        return found


@dataclass(frozen=True)
class TableConfig:
    name: str
    uri: str
    schema: dict[str, Any] | None  # Delta schema JSON; None: take the existing table's
    create: bool = True
    partition_by: tuple[str, ...] = ()
    unknown_fields: UnknownFields = "reject"
    tokens: Tokens = field(default_factory=lambda: Tokens(()), repr=False)
    allow_anonymous: bool = False


@dataclass(frozen=True)
class ServeConfig:
    tables: Mapping[str, TableConfig]
    host: str = "127.0.0.1"
    port: int = 8080
    # A request body above this is refused with 413 before it is read whole.
    max_body_bytes: int = 16 * 1024 * 1024
    # One NDJSON line / array element above this is refused (per-record error).
    max_event_bytes: int = 1024 * 1024
    # Bytes accepted but not yet committed, per table; above it requests get 503 +
    # Retry-After instead of growing memory without bound when storage is slow.
    max_pending_bytes: int = 256 * 1024 * 1024
    # Group commit: a group is committed when its oldest request has waited this long,
    # or when it holds this many rows / bytes. A longer delay makes fewer, larger files
    # (cheaper reads, smaller log) at the cost of acknowledgement latency.
    group_commit_max_delay_ms: float = 10.0
    group_commit_max_rows: int = 500_000
    group_commit_max_bytes: int = 64 * 1024 * 1024
    # Idempotency keys remembered per table (oldest forgotten first), and how many of the
    # table's latest commits are read at start-up to remember the keys committed before.
    idempotency_max_keys: int = 1_000_000
    idempotency_recover_commits: int = 10_000
    # fsync data files and the log entry before acknowledging (local tables only).
    fsync: bool = True
    log_level: str = "info"


def load_config(path: str | os.PathLike[str] | None, overrides: Mapping[str, Any]) -> ServeConfig:
    """The configuration from the TOML file at ``path`` (optional) with ``overrides``.

    ``overrides`` holds server keys (``port``, ...) and ``tables``: a mapping of table
    name to table keys, merged key by key over the file's.
    """
    raw: dict[str, Any] = {}
    base = Path.cwd()
    if path is not None:
        file = Path(path)
        try:
            raw = tomllib.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ServeConfigError(
                f"cannot read the configuration file {file}: {exc.strerror}.",
                option="--config",
            ) from exc
        except tomllib.TOMLDecodeError as exc:
            raise ServeConfigError(
                f"the configuration file {file} is not valid TOML: {exc}.", option="--config"
            ) from exc
        base = file.resolve().parent
        _check_keys(raw, ("server", "tables"), "the configuration file")
    server = dict(raw.get("server", {}))
    tables_raw: dict[str, dict[str, Any]] = {k: dict(v) for k, v in raw.get("tables", {}).items()}
    for key, value in overrides.items():
        if key == "tables":
            for name, keys in value.items():
                tables_raw.setdefault(name, {}).update(keys)
        elif value is not None:
            server[key] = value
    _check_keys(server, SERVER_KEYS, "[server]")
    if not tables_raw:
        raise ServeConfigError(
            "no tables are configured: add a [tables.<name>] section with 'path' to the"
            " configuration file, or pass --table NAME=PATH.",
            option="tables",
        )
    tables = {name: _table(name, keys, base) for name, keys in tables_raw.items()}
    config = ServeConfig(tables=tables)
    typed = {k: _coerce(k, v, getattr(config, k)) for k, v in server.items()}
    return replace(config, **typed)


def _check_keys(raw: Mapping[str, Any], valid: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(raw) - set(valid))
    if unknown:
        raise ServeConfigError(
            f"unknown key(s) {', '.join(unknown)} in {where}; valid keys: {', '.join(valid)}.",
            option=unknown[0],
            valid=valid,
        )


def _coerce(key: str, value: Any, default: Any) -> Any:
    expected = type(default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ServeConfigError(
            f"[server] {key} must be a {expected.__name__}, not {value!r}.", option=key
        )
    if expected in (int, float) and value < 0:
        raise ServeConfigError(f"[server] {key} must not be negative.", option=key)
    if key == "port" and not 0 <= value <= 65535:
        raise ServeConfigError(f"[server] port must be 0..65535, not {value}.", option=key)
    return value


def _table(name: str, keys: dict[str, Any], base: Path) -> TableConfig:
    where = f"[tables.{name}]"
    if not TABLE_NAME.match(name):
        raise ServeConfigError(
            f"table name {name!r} is not allowed: use letters, digits, '_', '.', '-'"
            " (at most 128, not starting with '.' or '-').",
            option=f"tables.{name}",
        )
    _check_keys(keys, TABLE_KEYS, where)
    location = keys.get("path")
    if not isinstance(location, str) or not location:
        raise ServeConfigError(f"{where} needs 'path' (the table's location).", option="path")
    if _uri.is_local(location) and not location.startswith("file:"):
        location = str(base / Path(location).expanduser())
    unknown_fields = keys.get("unknown_fields", "reject")
    if unknown_fields not in ("reject", "rescue"):
        raise ServeConfigError(
            f"{where} unknown_fields must be 'reject' or 'rescue', not {unknown_fields!r}.",
            option="unknown_fields",
            valid=("reject", "rescue"),
        )
    partition_by = keys.get("partition_by", [])
    if isinstance(partition_by, str):
        partition_by = [c.strip() for c in partition_by.split(",") if c.strip()]
    schema = _schema(keys.get("schema"), where, unknown_fields)
    tokens = _tokens(keys, where, base)
    anonymous = bool(keys.get("allow_anonymous", False))
    if not len(tokens) and not anonymous:
        raise ServeConfigError(
            f"{where} has no tokens: set 'tokens_env' (an environment variable holding"
            " comma-separated tokens) or 'tokens_file' (one token per line), or set"
            " 'allow_anonymous = true' to accept requests without a token.",
            option="tokens_env",
        )
    return TableConfig(
        name=name,
        uri=_uri.normalize_uri(location),
        schema=schema,
        create=bool(keys.get("create", True)),
        partition_by=tuple(partition_by),
        unknown_fields=unknown_fields,
        tokens=tokens,
        allow_anonymous=anonymous,
    )


def _schema(value: Any, where: str, unknown_fields: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if isinstance(value, dict):
        parsed: Any = value
    elif isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            raise ServeConfigError(
                f"{where} schema is not valid JSON: {exc}.", option="schema"
            ) from exc
    elif isinstance(value, str):
        from pyspark.sql.types import StructType

        from deltaflow.ingest.cloudfiles._schemas import parse_hints

        parsed = StructType(parse_hints(value)).jsonValue()
    else:
        raise ServeConfigError(
            f"{where} schema must be DDL text ('id BIGINT, kind STRING') or Delta schema JSON.",
            option="schema",
        )
    if not isinstance(parsed, dict) or parsed.get("type") != "struct" or not parsed.get("fields"):
        raise ServeConfigError(
            f"{where} schema must be a struct with at least one field.", option="schema"
        )
    names = [f.get("name") for f in parsed["fields"]]
    if unknown_fields == "rescue" and RESCUED_DATA_COLUMN not in names:
        parsed = {
            **parsed,
            "fields": [
                *parsed["fields"],
                {"name": RESCUED_DATA_COLUMN, "type": "string", "nullable": True, "metadata": {}},
            ],
        }
    return parsed


def _tokens(keys: dict[str, Any], where: str, base: Path) -> Tokens:
    values: list[str] = []
    variable = keys.get("tokens_env")
    if variable is not None:
        raw = os.environ.get(str(variable))
        if raw is None:
            raise ServeConfigError(
                f"{where} tokens_env names the environment variable {variable!r}, which is"
                " not set. Export it with comma-separated tokens before starting the service.",
                option="tokens_env",
            )
        values.extend(t.strip() for t in raw.split(","))
    token_file = keys.get("tokens_file")
    if token_file is not None:
        file = base / Path(str(token_file)).expanduser()
        try:
            lines = file.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ServeConfigError(
                f"{where} tokens_file {file} cannot be read: {exc.strerror}.",
                option="tokens_file",
            ) from exc
        values.extend(line.strip() for line in lines if not line.lstrip().startswith("#"))
    return Tokens(tuple(v.encode("utf-8") for v in values if v))
