"""``spark-pipeline.yml``: a pipeline's name, storage, libraries and settings.

The format of ``pyspark.pipelines`` (``spark-pipelines``): ``name`` and ``storage``
required; ``libraries`` a list of ``{glob: {include: PATTERN}}`` relative to the spec's
directory; ``configuration`` strings set on the session during an update; ``catalog``
and ``database`` (or ``schema``) where datasets are registered. deltaflow reads the
same file, so a project made by ``spark-pipelines init`` runs with ``deltaflow
pipelines run`` too. deltaflow's own settings are ``pipelines.*`` keys in
``configuration``; the one field it adds is Lakeflow's ``continuous`` (true: updates run
until stopped, as ``--continuous``), which ``spark-pipelines`` itself would refuse.
"""

from __future__ import annotations

import glob
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deltaflow.pipelines.errors import SpecError

SPEC_FILE_NAMES = ("spark-pipeline.yml", "spark-pipeline.yaml")
_FIELDS = (
    "name",
    "storage",
    "catalog",
    "database",
    "schema",
    "configuration",
    "libraries",
    "continuous",
)


@dataclass(frozen=True)
class PipelineSpec:
    """A parsed spec; ``root`` is the directory the library globs are relative to."""

    name: str
    storage: str
    root: Path
    libraries: tuple[str, ...] = ()
    configuration: Mapping[str, str] = field(default_factory=dict)
    catalog: str | None = None
    database: str | None = None
    continuous: bool = False

    def storage_path(self) -> str:
        """``storage`` as a local path or URI; ``file:`` URIs and relative paths
        (relative to the spec's directory) become absolute local paths."""
        storage = self.storage
        if storage.startswith("file://"):
            storage = storage[len("file://") :]
        elif storage.startswith("file:"):
            storage = storage[len("file:") :]
        if "://" in storage:
            return storage
        path = Path(storage)
        return str(path if path.is_absolute() else (self.root / path).resolve())

    def library_files(self) -> list[Path]:
        """The files the globs match, in a stable order (each glob's matches sorted)."""
        found: list[Path] = []
        for pattern in self.libraries:
            matches = sorted(
                p
                for p in self.root.glob(pattern)
                if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".sql")
            )
            found.extend(m for m in matches if m not in found)
        return found


def find_spec(start: Path) -> Path:
    """The spec file in ``start`` or its nearest ancestor that has one."""
    for directory in [start, *start.parents]:
        present = [directory / n for n in SPEC_FILE_NAMES if (directory / n).is_file()]
        if len(present) > 1:
            raise SpecError(
                f"{directory} has both {present[0].name} and {present[1].name}; keep one.",
                path=str(directory),
                field=None,
            )
        if present:
            return present[0]
    raise SpecError(
        f"no spark-pipeline.yml in {start} or any directory above it. Create one with"
        " `deltaflow pipelines init NAME`, or pass --spec FILE.",
        path=str(start),
        field=None,
    )


def load_spec(path: Path) -> PipelineSpec:
    """Parse and check the spec at ``path``."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise SpecError(f"cannot read {path}: {exc}", path=str(path), field=None) from exc
    return parse_spec(data, path)


def parse_spec(data: Any, path: Path) -> PipelineSpec:
    where = str(path)
    if not isinstance(data, Mapping):
        raise SpecError(
            f"{where} must be a YAML mapping (name: ..., storage: ...)", path=where, field=None
        )
    unknown = [k for k in data if k not in _FIELDS]
    if unknown:
        raise SpecError(
            f"{where}: unknown field {unknown[0]!r}; the fields are {', '.join(_FIELDS)}"
            " (deltaflow's own settings go in `configuration` as pipelines.* keys)",
            path=where,
            field=str(unknown[0]),
        )
    for required in ("name", "storage"):
        if not isinstance(data.get(required), str) or not data[required].strip():
            raise SpecError(
                f"{where}: `{required}` is required and must be a string",
                path=where,
                field=required,
            )
    configuration = data.get("configuration") or {}
    if not isinstance(configuration, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in configuration.items()
    ):
        raise SpecError(
            f"{where}: `configuration` must map strings to strings (quote values: 'true')",
            path=where,
            field="configuration",
        )
    libraries = []
    for entry in data.get("libraries") or []:
        include = entry.get("glob", {}).get("include") if isinstance(entry, Mapping) else None
        if not isinstance(include, str):
            raise SpecError(
                f"{where}: each library is `- glob: {{include: PATTERN}}`, got {entry!r}",
                path=where,
                field="libraries",
            )
        libraries.append(_library_pattern(include, where))
    continuous = data.get("continuous", False)
    if not isinstance(continuous, bool):
        raise SpecError(
            f"{where}: `continuous` must be true or false, got {continuous!r}",
            path=where,
            field="continuous",
        )
    database = data.get("database", data.get("schema"))
    return PipelineSpec(
        name=data["name"],
        storage=data["storage"],
        root=path.parent.resolve(),
        libraries=tuple(libraries),
        configuration=dict(configuration),
        catalog=data.get("catalog"),
        database=database,
        continuous=continuous,
    )


def _library_pattern(pattern: str, where: str) -> str:
    """``dir/**`` means every file under ``dir`` (as in spark-pipelines)."""
    if pattern.endswith("/**") and not glob.has_magic(pattern[:-3]):
        return pattern + "/*"
    return pattern
