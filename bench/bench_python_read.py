"""Where the Python read path spends its time, without Spark: one process, the scan table's files.

Times ``_reader.read_file`` (open, decode, shape every batch) against variants of the
pyarrow call and against the pieces it is made of: Parquet decode alone, ``_shape``
(the per-batch ``conform``), and serialising the batches to Arrow IPC (what the
Python worker does to hand them to the JVM).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from _common import parse_args, run_side_by_side, save_result
from _data import events_table


def main() -> dict[str, object]:
    args = parse_args(__doc__ or "")
    rows, files = (400_000, 4) if args.quick else (8_000_000, 8)
    path = events_table("events", rows, files)
    from pyspark.sql.types import StructType

    from deltaflow.spark.read import _reader
    from deltaflow.table import _schema, _uri
    from deltaflow.table._snapshot import load_snapshot

    snapshot = load_snapshot(str(path))
    tasks, _ = _reader.plan_scan(snapshot, [])
    schema = StructType.fromJson(_schema.logical_schema(snapshot.schema))
    layout = _reader.ReadLayout.build(snapshot, schema)
    local = [_uri.local_path(t.uri) for t in tasks]

    def decode(batch_rows: int, threads: bool = False, pre_buffer: bool = False):
        def run() -> None:
            for file in local:
                reader = pq.ParquetFile(file, pre_buffer=pre_buffer)
                for _ in reader.iter_batches(batch_size=batch_rows, use_threads=threads):
                    pass

        return run

    def read_file() -> None:
        for task in tasks:
            for _ in _reader.read_file(task, layout):
                pass

    batches = [b for f in local for b in pq.ParquetFile(f).iter_batches(batch_size=65536)]

    def shape() -> None:
        for task, batch in zip(tasks * (len(batches) // len(tasks) + 1), batches, strict=False):
            _reader._shape(batch, task, layout)

    def ipc() -> None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batches[0].schema) as writer:
            for batch in batches:
                writer.write_batch(batch)

    variants = {
        "read_file (as shipped)": read_file,
        "decode 64k, 1 thread": decode(65536),
        "decode 256k, 1 thread": decode(262144),
        "decode 64k, use_threads": decode(65536, threads=True),
        "decode 64k, pre_buffer": decode(65536, pre_buffer=True),
        "_shape of every batch": shape,
        "Arrow IPC of every batch": ipc,
    }
    timings = run_side_by_side(variants, args.reps)
    print(f"\n### Python read path pieces, {rows} rows, {files} files, one process\n")
    print("| step | median s | rows/s |")
    print("| --- | ---: | ---: |")
    table = []
    for name in variants:
        seconds = timings.median(name)
        table.append((name, seconds, rows / seconds))
        print(f"| {name} | {seconds:.3f} | {rows / seconds / 1e6:.1f} M |")
    save_result("python_read_quick" if args.quick else "python_read", {"table": table})
    return {"table": table}


if __name__ == "__main__":
    main()
