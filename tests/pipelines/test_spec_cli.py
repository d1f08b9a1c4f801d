"""spark-pipeline.yml, SQL library files and the `deltaflow pipelines` command."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable as DeltaRsTable

from deltaflow import pipelines as dp
from deltaflow.cli import main
from deltaflow.pipelines import _commands
from deltaflow.pipelines._loader import split_statements
from deltaflow.pipelines._spec import find_spec, load_spec
from deltaflow.pipelines.errors import SpecError


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("name: p\nstorage: s\nschedule: daily\n", "schedule"),
        ("name: p\n", "storage"),
        ("name: p\nstorage: s\nconfiguration: {a: 1}\n", "configuration"),
        ("name: p\nstorage: s\nlibraries: [{file: x.py}]\n", "libraries"),
    ],
)
def test_bad_specs_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(_write(tmp_path / "spark-pipeline.yml", text))
    assert caught.value.field == field  # type: ignore[attr-defined]


def test_spec_is_found_upwards_and_globs_resolve_from_its_directory(tmp_path: Path) -> None:
    spec_path = _write(
        tmp_path / "spark-pipeline.yml",
        "name: p\nstorage: file://"
        + str(tmp_path / "st")
        + "\ndatabase: sales\nlibraries:\n  - glob:\n      include: transformations/**\n",
    )
    _write(tmp_path / "transformations/a.py", "")
    _write(tmp_path / "transformations/deep/b.sql", "")
    _write(tmp_path / "transformations/notes.txt", "")
    (tmp_path / "sub").mkdir()
    assert find_spec(tmp_path / "sub") == spec_path
    spec = load_spec(spec_path)
    assert spec.storage_path() == str(tmp_path / "st")
    assert spec.database == "sales"
    assert [p.name for p in spec.library_files()] == ["a.py", "b.sql"]
    with pytest.raises(SpecError, match="pipelines init"):
        find_spec(Path("/"))


def test_sql_statements_split_outside_quotes_and_comments() -> None:
    text = (
        "CREATE VIEW a AS SELECT ';' AS x;\n-- a comment; still a comment\n"
        "CREATE VIEW b AS SELECT 2"
    )
    statements = [s for _, s in split_statements(text)]
    assert statements == ["CREATE VIEW a AS SELECT ';' AS x", "CREATE VIEW b AS SELECT 2"]


def test_init_then_run_a_project_with_python_and_sql_datasets(
    spark: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    project = _commands.init_project("shop", tmp_path)
    spec_file = project / "spark-pipeline.yml"
    database = f"shop_{uuid.uuid4().hex[:8]}"
    landing = tmp_path / "landing"
    spark.range(10).write.json(str(landing))
    spec_file.write_text(
        spec_file.read_text()
        + f"database: {database}\nconfiguration:\n  shop.landing: '{landing}'\n"
    )
    _write(
        project / "transformations/streams.sql",
        """
        CREATE STREAMING TABLE numbers_stream (
          CONSTRAINT small EXPECT (id < 8) ON VIOLATION DROP ROW,
          CONSTRAINT known EXPECT (id IS NOT NULL)
        ) COMMENT 'ids as a stream' AS SELECT id FROM STREAM(landed);
        CREATE VIEW doubled AS SELECT id * 2 AS twice FROM example_sql_materialized_view
        """,
    )
    _write(
        project / "transformations/source.py",
        "from deltaflow import pipelines as dp\n\n"
        "@dp.table\n"
        "def landed():\n"
        "    path = spark.conf.get('shop.landing')\n"
        "    return spark.readStream.schema('id BIGINT').json(path)\n",
    )
    lines: list[str] = []
    resolution = _commands.dry_run_spec(spec_file, lines.append, spark=spark)
    assert "numbers_stream" in resolution.flows
    assert resolution.flows["example_sql_materialized_view"].inputs == (
        "example_python_materialized_view",
    )
    assert lines[-1].startswith("pipeline 'shop' is valid")
    assert not (project / "pipeline-storage").exists()

    report = _commands.run_spec(spec_file, lines.append, spark=spark, development=True)
    assert report.state == "COMPLETED", report
    tables = project / "pipeline-storage/tables"
    python_mv = sorted(
        r["id"]
        for r in DeltaRsTable(str(tables / "example_python_materialized_view"))
        .to_pyarrow_table()
        .to_pylist()
    )
    assert python_mv == [0, 2, 4, 6, 8]
    sql_mv = sorted(
        r["id"]
        for r in DeltaRsTable(str(tables / "example_sql_materialized_view"))
        .to_pyarrow_table()
        .to_pylist()
    )
    assert sql_mv == [4, 6, 8]
    assert any("example_sql_materialized_view: COMPLETED" in line for line in lines)
    assert lines[-1].endswith("COMPLETED")
    # The SQL view was analysed before the table it reads existed, and again after: that
    # expected first failure is not logged as an ERROR by pyspark.
    assert "TABLE_OR_VIEW_NOT_FOUND" not in capfd.readouterr().err
    rules = {
        r.name: (r.passed_records, r.failed_records)
        for r in report.flows["numbers_stream"].expectations
    }
    assert rules == {"small": (8, 2), "known": (10, 0)}
    stream = DeltaRsTable(str(tables / "numbers_stream")).to_pyarrow_table()
    assert sorted(stream.column("id").to_pylist()) == list(range(8))


def test_cli_reports_errors_with_exit_codes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pipelines", "dry-run", "--spec", str(tmp_path / "missing.yml")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert main(["pipelines", "run", "--spec", str(tmp_path / "x.yml")]) == 2
    assert "x.yml" in capsys.readouterr().err
    with pytest.raises(dp.PipelineError):
        _commands.init_project("p", tmp_path) and _commands.init_project("p", tmp_path)
