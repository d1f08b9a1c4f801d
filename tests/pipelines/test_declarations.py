"""Declaring a pipeline builds frozen descriptions and checks them, without Spark."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from deltaflow import pipelines as dp
from deltaflow.pipelines import dlt


def test_importing_and_declaring_needs_no_pyspark(tmp_path: Path) -> None:
    module = tmp_path / "my_pipeline.py"
    module.write_text(
        textwrap.dedent(
            """
            from deltaflow.pipelines import dlt

            @dlt.table(comment="raw events")
            @dlt.expect_or_drop("has_id", "id IS NOT NULL")
            def bronze():
                return dlt.read_stream("landing")
            """
        )
    )
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from deltaflow import pipelines as dp
        with dp.collect() as declared:
            import my_pipeline
        graph = declared.graph()
        assert graph.dataset("bronze").expectations[0].action == "drop"
        assert "pyspark" not in sys.modules, sorted(m for m in sys.modules if "spark" in m)
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_table_view_and_materialized_view_are_datasets_with_their_own_flow() -> None:
    with dp.collect() as declared:

        @dp.table(partition_cols=["day"], table_properties={"delta.appendOnly": "true"})
        def events() -> None: ...

        @dp.materialized_view(name="daily", comment="per day")
        def daily_counts() -> None: ...

        @dp.temporary_view
        def cleaned() -> None: ...

    graph = declared.graph()
    assert {n: d.kind for n, d in graph.datasets.items()} == {
        "events": "streaming_table",
        "daily": "materialized_view",
        "cleaned": "temporary_view",
    }
    events_ds = graph.dataset("EVENTS")  # names are case-insensitive
    assert events_ds is not None
    assert events_ds.partition_cols == ("day",)
    assert events_ds.table_properties == {"delta.appendOnly": "true"}
    assert graph.dataset("daily").comment == "per day"  # type: ignore[union-attr]
    own = graph.flows["daily"]
    assert isinstance(own, dp.Flow) and own.target == "daily" and own.func is daily_counts
    assert own.location.path == __file__ and own.location.line is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        events_ds.name = "x"  # type: ignore[misc]


def test_expectations_in_declaration_order_above_or_below_the_decorator() -> None:
    with dp.collect() as declared:

        @dp.expect_or_fail("positive", "amount > 0")
        @dp.table
        @dp.expect("has_id", "id IS NOT NULL")
        @dp.expect_all_or_drop({"known_kind": "kind IN ('a', 'b')", "recent": "ts > '2020'"})
        def orders() -> None: ...

        dp.create_streaming_table(
            "all_orders", expect_all={"a": "x > 1"}, expect_all_or_fail={"b": "y < 2"}
        )

    graph = declared.graph()
    rules = [(e.name, e.action) for e in graph.dataset("orders").expectations]  # type: ignore[union-attr]
    assert rules == [
        ("positive", "fail"),
        ("has_id", "warn"),
        ("known_kind", "drop"),
        ("recent", "drop"),
    ]
    assert graph.dataset("all_orders").expectations == (  # type: ignore[union-attr]
        dp.Expectation("a", "x > 1", "warn"),
        dp.Expectation("b", "y < 2", "fail"),
    )


def test_append_flows_and_sinks() -> None:
    with dp.collect() as declared:
        dp.create_streaming_table("all_events")
        dp.create_sink("out", "kafka", {"topic": "t"})

        @dp.append_flow(target="all_events")
        def from_web() -> None: ...

        @dp.append_flow(target="all_events", name="backfill", once=True)
        def old_events() -> None: ...

        @dp.append_flow(target="out")
        def to_kafka() -> None: ...

    graph = declared.graph()
    assert [f.name for f in graph.flows_into("all_events")] == ["from_web", "backfill"]
    assert graph.flows["backfill"].once is True
    assert graph.sink("out") == dp.Sink("out", "kafka", {"topic": "t"}, graph.sink("out").location)  # type: ignore[union-attr]
    assert graph.datasets["all_events"].kind == "streaming_table"


def test_auto_cdc_declarations() -> None:
    with dp.collect() as declared:
        dp.create_streaming_table("customers")
        dp.create_auto_cdc_flow(
            target="customers",
            source="customer_changes",
            keys=["id"],
            sequence_by="seq",
            apply_as_deletes="op = 'DELETE'",
            except_column_list=["op", "seq"],
            stored_as_scd_type="2",
            track_history_except_column_list=["updated_at"],
        )
        dp.create_streaming_table("products")
        dlt.apply_changes_from_snapshot(target="products", source="products_raw", keys=["sku"])

    graph = declared.graph()
    cdc = graph.flows["customers"]
    assert isinstance(cdc, dp.AutoCdcFlow)
    assert (cdc.keys, cdc.sequence_by, cdc.stored_as_scd_type) == (("id",), "seq", 2)
    assert cdc.except_column_list == ("op", "seq")
    assert cdc.track_history_except_column_list == ("updated_at",)
    snap = graph.flows["products"]
    assert isinstance(snap, dp.AutoCdcSnapshotFlow) and snap.stored_as_scd_type == 1


def test_dlt_names_declare_undecided_tables_and_views() -> None:
    with dp.collect() as declared:

        @dlt.view
        def raw() -> None: ...

        @dlt.table(path="/tmp/x", temporary=True)
        def silver() -> None: ...

    graph = declared.graph()
    assert graph.datasets["raw"].kind == "temporary_view"
    silver = graph.datasets["silver"]
    assert (silver.kind, silver.path, silver.temporary) == ("table", "/tmp/x", True)


@pytest.mark.parametrize(
    ("declare", "fragment"),
    [
        (lambda: dp.create_streaming_table("t", partition_cols="day"), "partition_cols"),
        (lambda: dp.create_streaming_table("t", table_properties={"a": 1}), "strings"),
        (lambda: dp.create_streaming_table("t", schema=42), "DDL string"),
        (lambda: dp.create_streaming_table("t", expect_all=["x > 1"]), "dict of"),
        (lambda: dp.create_streaming_table(""), "non-empty string"),
        (
            lambda: dp.create_auto_cdc_flow(
                "t", "s", keys=["k"], sequence_by="q", stored_as_scd_type=3
            ),
            "1 or 2",
        ),
        (
            lambda: dp.create_auto_cdc_flow(
                "t", "s", keys=["k"], sequence_by="q", column_list=["a"], except_column_list=["b"]
            ),
            "not both",
        ),
        (
            lambda: dp.create_auto_cdc_flow(
                "t", "s", keys=["k"], sequence_by="q", track_history_column_list=["a"]
            ),
            "scd_type=2",
        ),
        (
            lambda: dp.create_auto_cdc_flow(
                "t", "s", keys=["k"], sequence_by="q", stored_as_scd_type=2, apply_as_truncates="x"
            ),
            "SCD type 1",
        ),
        (lambda: dp.create_auto_cdc_flow("t", "s", keys=[], sequence_by="q"), "at least one"),
        (lambda: dp.create_auto_cdc_flow("t", "s", keys=["k"], sequence_by=["a", "b"]), "struct"),
        (lambda: dp.table(format="parquet")(lambda: None), "Delta tables"),
        (lambda: dp.table(partition_cols=["a"], cluster_by=["b"])(lambda: None), "both"),
    ],
)
def test_bad_arguments_are_definition_errors_naming_the_line(declare, fragment) -> None:  # type: ignore[no-untyped-def]
    with dp.collect(), pytest.raises(dp.DefinitionError) as caught:
        declare()
    assert fragment in str(caught.value)
    assert caught.value.location.startswith(__file__)  # type: ignore[attr-defined]


def test_duplicates_and_bad_targets_are_refused() -> None:
    with dp.collect(), pytest.raises(dp.DefinitionError) as twice:

        @dp.table(name="t")
        def a() -> None: ...

        @dp.materialized_view(name="T")
        def b() -> None: ...

    assert twice.value.dataset == "T"  # type: ignore[attr-defined]
    assert "declared twice" in str(twice.value)

    for declare_target, fragment in [
        (lambda: None, "does not declare"),
        (lambda: dp.materialized_view(name="mv")(lambda: None), "materialized view"),
    ]:
        with dp.collect() as declared:
            declare_target()

            @dp.append_flow(target="mv")
            def into_mv() -> None: ...

        with pytest.raises(dp.DefinitionError) as caught:
            declared.graph()
        assert fragment in str(caught.value)
        assert caught.value.dataset == "into_mv"  # type: ignore[attr-defined]

    with dp.collect() as mixed:
        dp.create_streaming_table("dim")
        dp.create_auto_cdc_flow("dim", "changes", keys=["k"], sequence_by="s")

        @dp.append_flow(target="dim")
        def extra() -> None: ...

    with pytest.raises(dp.DefinitionError, match="only AUTO CDC flows"):
        mixed.graph()


def test_declaring_outside_a_pipeline_says_how_to_load_it() -> None:
    with pytest.raises(dp.NoActivePipelineError) as caught:
        dp.create_streaming_table("orphan")
    assert "collect()" in str(caught.value)
    with pytest.raises(dp.NoActivePipelineError, match="no pipeline is running"):
        dlt.read("bronze")
