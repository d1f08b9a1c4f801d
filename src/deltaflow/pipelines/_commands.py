"""What ``deltaflow pipelines init | dry-run | run`` do, callable from tests.

Each takes the spec's path (or finds ``spark-pipeline.yml`` upwards from the current
directory) and a ``print``-like function for progress; ``run`` prints one line per flow
state change as the event log records it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from deltaflow.pipelines._spec import PipelineSpec, find_spec, load_spec
from deltaflow.pipelines.errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from deltaflow.pipelines._analysis import Resolution
    from deltaflow.pipelines._runner import PipelineSettings, UpdateReport

Printer = Callable[[str], None]

_SPEC = """name: {name}
storage: pipeline-storage
libraries:
  - glob:
      include: transformations/**
"""
_PYTHON = """from deltaflow import pipelines as dp


@dp.materialized_view
@dp.expect_or_drop("even", "id % 2 = 0")
def example_python_materialized_view():
    return spark.range(10)
"""
_SQL = """CREATE MATERIALIZED VIEW example_sql_materialized_view AS
SELECT id FROM example_python_materialized_view
WHERE id > 2
"""


def init_project(name: str, parent: Path) -> Path:
    """A new pipeline project ``parent/name``: spec, one Python and one SQL dataset."""
    project = parent / name
    if project.exists():
        raise PipelineError(
            f"{project} exists already; choose another name or remove it.", path=str(project)
        )
    (project / "transformations").mkdir(parents=True)
    (project / "spark-pipeline.yml").write_text(_SPEC.format(name=name), encoding="utf-8")
    (project / "transformations" / "example_python_materialized_view.py").write_text(_PYTHON)
    (project / "transformations" / "example_sql_materialized_view.sql").write_text(_SQL)
    return project


def _spec(path: Path | None) -> PipelineSpec:
    return load_spec(path if path is not None else find_spec(Path.cwd()))


def spec_is_continuous(path: Path | None) -> bool:
    """True when the spec says ``continuous: true`` (its updates run until stopped)."""
    return _spec(path).continuous


def settings_of(spec: PipelineSpec, *, development: bool = False) -> PipelineSettings:
    from deltaflow.pipelines._runner import PipelineSettings
    from deltaflow.pipelines._storage import CHECKPOINT_ROOT

    configuration = dict(spec.configuration)
    checkpoints = configuration.get(CHECKPOINT_ROOT)
    if checkpoints and "://" not in checkpoints:
        # Relative to the spec's directory, as `storage` is.
        configuration[CHECKPOINT_ROOT] = str((spec.root / Path(checkpoints).expanduser()).resolve())
    return PipelineSettings(
        name=spec.name,
        storage=spec.storage_path(),
        database=spec.database or "default",
        configuration=configuration,
        development=development,
        continuous=spec.continuous,
    )


def remote_url(remote: str | None) -> str | None:
    """The Spark Connect server an update runs through: ``remote`` (``--remote``), else
    ``$SPARK_REMOTE`` (pyspark's own variable), else None (a local classic session)."""
    url = (remote or os.environ.get("SPARK_REMOTE", "")).strip()
    if not url:
        return None
    if not url.startswith("sc://"):
        from deltaflow.errors import InvalidOptionError

        raise InvalidOptionError(
            f"{url!r} is not a Spark Connect URL. Give --remote (or SPARK_REMOTE) as"
            " sc://host:port, the address of a Connect server started with"
            " deltaflow.spark_conf().",
            option="remote" if remote else "SPARK_REMOTE",
        )
    return url


def _session(spec: PipelineSpec, remote: str | None = None) -> SparkSession:
    import deltaflow

    url = remote_url(remote)
    if url is not None:
        return deltaflow.session(app_name=f"pipeline {spec.name}", remote=url)
    return deltaflow.session(app_name=f"pipeline {spec.name}")


def dry_run_spec(
    path: Path | None,
    echo: Printer,
    spark: SparkSession | None = None,
    *,
    remote: str | None = None,
) -> Resolution:
    """Validate the spec's graph (``remote``: through that Connect server)."""
    from deltaflow.pipelines._loader import load_graph
    from deltaflow.pipelines._runner import dry_run

    spec = _spec(path)
    spark = spark or _session(spec, remote)
    resolution = dry_run(spark, load_graph(spark, spec), settings_of(spec))
    for name in resolution.order:
        flow = resolution.flows[name]
        reads = ", ".join(flow.inputs) or "-"
        kind = (
            resolution.datasets[flow.flow.target].kind
            if flow.flow.target in resolution.datasets
            else "sink"
        )
        echo(f"  {name} -> {flow.flow.target} ({kind}); reads: {reads}")
    echo(f"pipeline {spec.name!r} is valid: {len(resolution.flows)} flows, nothing ran")
    return resolution


def run_spec(
    path: Path | None,
    echo: Printer,
    *,
    refresh: Sequence[str] | None = None,
    full_refresh: Sequence[str] | None = None,
    full_refresh_all: bool = False,
    development: bool = False,
    continuous: bool = False,
    stop: threading.Event | None = None,
    spark: SparkSession | None = None,
    remote: str | None = None,
) -> UpdateReport:
    """One update of the spec's pipeline (``remote``: its flows run through that Spark
    Connect server, see :mod:`._connect`)."""
    from deltaflow.pipelines._loader import load_graph
    from deltaflow.pipelines._runner import run_update

    spec = _spec(path)
    spark = spark or _session(spec, remote)
    report = run_update(
        spark,
        load_graph(spark, spec),
        settings_of(spec, development=development),
        refresh=refresh,
        full_refresh=full_refresh,
        full_refresh_all=full_refresh_all,
        on_event=lambda event: _print_event(event, echo),
        continuous=continuous,
        stop=stop,
    )
    for name, flow in report.flows.items():
        rows = "" if flow.rows_written is None else f", {flow.rows_written} rows"
        echo(f"  {name}: {flow.status}{rows}" + (f" ({flow.error})" if flow.error else ""))
    echo(f"update {report.update_id[:8]} {report.state}")
    return report


def _print_event(event: dict[str, Any], echo: Printer) -> None:
    if event["event_type"] == "flow_progress":
        details = json.loads(event["details"])["flow_progress"]
        status = details["status"]
        if status in ("RUNNING", "COMPLETED", "FAILED", "RETRYING", "SKIPPED", "STOPPED"):
            rows = (details.get("metrics") or {}).get("num_output_rows")
            batch = details.get("batch_id")
            extra = "" if batch is None else f" batch {batch}, {rows} rows so far"
            if details.get("trigger") == "RealTime":
                extra += " (real-time)"
            echo(f"[{event['timestamp']:%H:%M:%S}] {event['origin']['flow_name']}: {status}{extra}")
    elif event["event_type"] == "update_progress":
        state = json.loads(event["details"])["update_progress"]["state"]
        echo(f"[{event['timestamp']:%H:%M:%S}] update: {state}")
