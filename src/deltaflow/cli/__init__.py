"""The ``deltaflow`` command. Thin: parses arguments and calls library functions.

    deltaflow serve --config serve.toml [--host H] [--port P] [--table NAME=PATH]
                    [--schema NAME=DDL] [--token-env NAME=VAR] [--token-file NAME=FILE]
                    [--max-body-bytes N] [--max-delay-ms MS] [--max-rows N]

Flags override the file. See docs/ingest-http.md.

    deltaflow sql-server [--host H] [--port P] [--master M] [--warehouse DIR]
                         [--password-file FILE] [--tls-keystore FILE
                         --tls-keystore-password-env VAR] [--conf KEY=VALUE ...]
    deltaflow sql-server --add-user USER --password-file FILE   (password on stdin)

Spark's Thrift JDBC server on a deltaflow session (docs/sql.md).

    deltaflow pipelines init NAME
    deltaflow pipelines dry-run [--spec FILE] [--remote sc://HOST:PORT]
    deltaflow pipelines run [--spec FILE] [--refresh T,...] [--full-refresh T,...]
                            [--full-refresh-all] [--development] [--remote sc://HOST:PORT]

Declarative pipelines from a spark-pipeline.yml (docs/pipelines.md).

    deltaflow console [--host 127.0.0.1] [--port 8765] [--token-env VAR] [--ingest URL]
                      ROOT...

A read-only web console over the Delta tables under the roots (docs/console.md).

    deltaflow maintain [--once] [--interval SECONDS] [--dry-run] [--min-small-files N]
                       [--log-level L] ROOT...

Keeps the Delta tables under the roots healthy: compaction, checkpoints, log cleanup,
VACUUM, per each table's properties (docs/sql.md, Maintenance service).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence
from typing import Any

from deltaflow.errors import DeltaflowError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="deltaflow", description="deltaflow command line")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the HTTP ingest service",
        description="Append events POSTed over HTTP to Delta tables (docs/ingest-http.md).",
    )
    serve.add_argument("--config", help="TOML configuration file")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080; 0: any)")
    serve.add_argument(
        "--table", action="append", default=[], metavar="NAME=PATH", help="serve a table"
    )
    serve.add_argument(
        "--schema", action="append", default=[], metavar="NAME=DDL", help="schema to create with"
    )
    serve.add_argument(
        "--token-env",
        action="append",
        default=[],
        metavar="NAME=VAR",
        help="environment variable with the table's comma-separated tokens",
    )
    serve.add_argument(
        "--token-file",
        action="append",
        default=[],
        metavar="NAME=FILE",
        help="file with the table's tokens, one per line",
    )
    serve.add_argument("--max-body-bytes", type=int, help="largest request body accepted")
    serve.add_argument("--max-delay-ms", type=float, help="group commit: longest wait")
    serve.add_argument("--max-rows", type=int, help="group commit: most rows per commit")
    serve.add_argument("--no-fsync", action="store_true", help="do not fsync before acknowledging")
    serve.add_argument("--log-level", help="debug, info, warning, error")
    sql = commands.add_parser(
        "sql-server",
        help="run Spark's Thrift JDBC server on a deltaflow session",
        description="Serve SQL over JDBC (beeline, BI tools) on a deltaflow session.",
    )
    sql.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    sql.add_argument("--port", type=int, default=10000, help="port (default 10000)")
    sql.add_argument("--master", help="Spark master (default local[cores])")
    sql.add_argument("--warehouse", help="where managed tables go (spark.sql.warehouse.dir)")
    sql.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )
    sql.add_argument(
        "--password-file",
        metavar="FILE",
        help="users and salted password hashes clients log in with (required off loopback)",
    )
    sql.add_argument(
        "--add-user",
        metavar="USER",
        help="add USER to --password-file (password read from stdin or prompted) and exit",
    )
    sql.add_argument("--tls-keystore", metavar="FILE", help="JKS/PKCS12 keystore: serve TLS")
    sql.add_argument(
        "--tls-keystore-password-env",
        metavar="VAR",
        help="environment variable holding the keystore's password",
    )
    _pipelines_parser(commands)
    console = commands.add_parser(
        "console",
        help="serve the read-only web console over the tables under ROOT",
        description="Browse the Delta tables under the roots (docs/console.md).",
    )
    console.add_argument("roots", nargs="+", metavar="ROOT", help="a directory of tables")
    console.add_argument("--host", default="127.0.0.1", help="address (default 127.0.0.1)")
    console.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any)")
    console.add_argument(
        "--token-env",
        metavar="VAR",
        help="environment variable holding the token (required for a non-loopback --host)",
    )
    console.add_argument(
        "--ingest",
        action="append",
        default=[],
        metavar="URL",
        help="a running `deltaflow serve` to show on the Ingest page (its /metrics)",
    )
    _maintain_parser(commands)
    return parser


def _sql_server(args: argparse.Namespace) -> int:
    import os

    from deltaflow.spark import _sql_server, _sql_server_security

    try:
        if args.add_user:
            if not args.password_file:
                print("deltaflow sql-server: --add-user needs --password-file", file=sys.stderr)
                return 2
            _sql_server_security.add_user(args.password_file, args.add_user, _read_password())
            print(f"deltaflow sql-server: {args.add_user} added to {args.password_file}")
            return 0
        conf = {}
        for pair in args.conf:
            key, sep, value = pair.partition("=")
            if not sep or not key:
                print(
                    f"deltaflow sql-server: --conf expects KEY=VALUE, not {pair!r}", file=sys.stderr
                )
                return 2
            conf[key] = value
        # The one place the keystore's password is read: the variable the operator names.
        env = args.tls_keystore_password_env
        _sql_server.serve(
            args.host,
            args.port,
            args.master,
            args.warehouse,
            conf,
            password_file=args.password_file,
            tls_keystore=args.tls_keystore,
            tls_keystore_password=os.environ.get(env) if env else None,
        )
    except DeltaflowError as exc:
        print(f"deltaflow sql-server: {exc}", file=sys.stderr)
        return 2
    return 0


def _read_password() -> str:
    """A password from the terminal (asked twice) or, when stdin is not one, its first line."""
    import getpass

    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        from deltaflow.spark.errors import SqlServerConfigError

        raise SqlServerConfigError("the two passwords differ: try again.", option="--add-user")
    return first


def _maintain_parser(commands: Any) -> None:
    maintain = commands.add_parser(
        "maintain",
        help="keep the Delta tables under some folders healthy",
        description="Compact, checkpoint, clean up and VACUUM the Delta tables under the"
        " roots, per each table's own properties (docs/sql.md, Maintenance service).",
    )
    maintain.add_argument("roots", nargs="+", metavar="ROOT", help="a folder of tables, or a table")
    maintain.add_argument("--once", action="store_true", help="run one pass and exit")
    maintain.add_argument(
        "--interval", type=float, default=300.0, help="seconds between passes (default 300)"
    )
    maintain.add_argument(
        "--dry-run", action="store_true", help="decide and report; change nothing"
    )
    maintain.add_argument(
        "--min-small-files",
        type=int,
        default=None,
        help="compact a partition once it holds this many small files (default 50)",
    )
    maintain.add_argument("--log-level", default="info", help="debug, info, warning, error")


def _maintain(args: argparse.Namespace) -> int:
    import logging

    from deltaflow import maintain

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.interval <= 0 or (args.min_small_files is not None and args.min_small_files < 2):
        print(
            "deltaflow maintain: --interval must be above 0 and --min-small-files at least 2",
            file=sys.stderr,
        )
        return 2
    options = maintain.MaintainOptions(dry_run=args.dry_run)
    if args.min_small_files is not None:
        options = maintain.MaintainOptions(
            dry_run=args.dry_run, min_small_files=args.min_small_files
        )
    try:
        if args.once:
            maintain.run_pass(args.roots, options).raise_for_failures()
            return 0
        maintain.run_service(args.roots, options, interval=args.interval, stop=_stop_on_signals())
    except maintain.MaintenanceFailedError as exc:
        print(exc, file=sys.stderr)
        return 1
    except DeltaflowError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


def _pipelines_parser(commands: Any) -> None:
    pipelines = commands.add_parser(
        "pipelines",
        help="declarative pipelines: init, dry-run, run",
        description="Run a spark-pipeline.yml pipeline (docs/pipelines.md).",
    )
    actions = pipelines.add_subparsers(dest="action", required=True)
    init = actions.add_parser("init", help="create a pipeline project")
    init.add_argument("name", help="the project directory to create")
    dry = actions.add_parser("dry-run", help="validate the graph; run nothing")
    dry.add_argument("--spec", help="spark-pipeline.yml (default: found from here up)")
    dry.add_argument("--remote", metavar="sc://HOST:PORT", help=_REMOTE_HELP)
    run = actions.add_parser("run", help="run one triggered update")
    run.add_argument("--spec", help="spark-pipeline.yml (default: found from here up)")
    run.add_argument("--refresh", default="", metavar="T,...", help="update only these")
    run.add_argument(
        "--full-refresh", default="", metavar="T,...", help="empty these and start them over"
    )
    run.add_argument("--full-refresh-all", action="store_true", help="start every table over")
    run.add_argument(
        "--development", action="store_true", help="development mode (no flow retries)"
    )
    run.add_argument(
        "--continuous",
        action="store_true",
        help="keep streams running until SIGINT / SIGTERM (pipelines.trigger.interval)",
    )
    run.add_argument("--remote", metavar="sc://HOST:PORT", help=_REMOTE_HELP)


_REMOTE_HELP = (
    "run the flows through this Spark Connect server (started with deltaflow.spark_conf());"
    " default: $SPARK_REMOTE, else a local session"
)


def _pipelines(args: argparse.Namespace) -> int:
    from pathlib import Path

    from deltaflow.pipelines import _commands

    spec = Path(args.spec) if getattr(args, "spec", None) else None
    try:
        if args.action == "init":
            project = _commands.init_project(args.name, Path.cwd())
            print(f"created {project}; run it with: cd {args.name} && deltaflow pipelines run")
            return 0
        if args.action == "dry-run":
            _commands.dry_run_spec(spec, print, remote=args.remote)
            return 0
        continuous = args.continuous or _commands.spec_is_continuous(spec)
        stop = _stop_on_signals() if continuous else None
        report = _commands.run_spec(
            spec,
            print,
            refresh=_names(args.refresh),
            full_refresh=_names(args.full_refresh),
            full_refresh_all=args.full_refresh_all,
            development=args.development,
            continuous=continuous,
            stop=stop,
            remote=args.remote,
        )
    except DeltaflowError as exc:
        print(f"deltaflow pipelines {args.action}: {exc}", file=sys.stderr)
        return 2
    return 1 if report.state == "FAILED" else 0


def _stop_on_signals() -> threading.Event:
    """An event set by SIGINT / SIGTERM: a continuous update stops cleanly on it."""
    import signal

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _names(value: str) -> list[str] | None:
    names = [n.strip() for n in value.split(",") if n.strip()]
    return names or None


def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of ``deltaflow serve`` as configuration overrides."""
    from deltaflow.ingest.http.errors import ServeConfigError

    tables: dict[str, dict[str, Any]] = {}
    pairs = (
        ("--table", args.table, "path"),
        ("--schema", args.schema, "schema"),
        ("--token-env", args.token_env, "tokens_env"),
        ("--token-file", args.token_file, "tokens_file"),
    )
    for flag, values, key in pairs:
        for value in values:
            name, sep, rest = value.partition("=")
            if not sep or not name or not rest:
                raise ServeConfigError(f"{flag} expects NAME=VALUE, not {value!r}.", option=flag)
            tables.setdefault(name, {})[key] = rest
    return {
        "host": args.host,
        "port": args.port,
        "max_body_bytes": args.max_body_bytes,
        "group_commit_max_delay_ms": args.max_delay_ms,
        "group_commit_max_rows": args.max_rows,
        "fsync": False if args.no_fsync else None,
        "log_level": args.log_level,
        "tables": tables,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        from deltaflow.ingest.http._app import serve
        from deltaflow.ingest.http._config import load_config

        try:
            config = load_config(args.config, serve_overrides(args))
            serve(config)
        except DeltaflowError as exc:
            print(f"deltaflow serve: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.command == "sql-server":
        return _sql_server(args)
    if args.command == "pipelines":
        return _pipelines(args)
    if args.command == "console":
        from deltaflow.console import ConsoleConfig, serve_console

        try:
            console = ConsoleConfig.build(
                args.roots,
                host=args.host,
                port=args.port,
                token_env=args.token_env,
                ingest=args.ingest,
            )
            serve_console(console)
        except DeltaflowError as exc:
            print(f"deltaflow console: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:  # the port is taken, or the address is not ours
            print(
                f"deltaflow console: cannot listen on {args.host}:{args.port}: {exc}",
                file=sys.stderr,
            )
            return 2
        return 0
    if args.command == "maintain":
        return _maintain(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
