"""The console's configuration: where to listen, which roots, which token."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from deltaflow.console.errors import ConsoleConfigError


@dataclass(frozen=True)
class ConsoleConfig:
    """``roots`` are local directories; ``token`` (never printed) guards every request."""

    roots: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = field(default=None, repr=False)
    ingest: tuple[str, ...] = ()  # base URLs of `deltaflow serve` services to scrape

    @classmethod
    def build(
        cls,
        roots: Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int = 8765,
        token_env: str | None = None,
        ingest: Sequence[str] = (),
        environ: Mapping[str, str] | None = None,
    ) -> ConsoleConfig:
        """Check the flags of ``deltaflow console`` and read the token from the environment
        (the one place the console reads it)."""
        if not roots:
            raise ConsoleConfigError(
                "give at least one ROOT directory: deltaflow console /path/to/tables",
                option="ROOT",
            )
        resolved = []
        for root in roots:
            if "://" in root and not root.startswith("file://"):
                raise ConsoleConfigError(
                    f"root {root!r} is not a local directory: the console browses local"
                    " directories only (mount the bucket, or run it where the files are).",
                    option="ROOT",
                )
            path = os.path.realpath(root.removeprefix("file://"))
            if not os.path.isdir(path):
                raise ConsoleConfigError(
                    f"root {root!r} is not a directory: pass the folder that holds the tables.",
                    option="ROOT",
                )
            resolved.append(path)
        if not 0 <= port <= 65535:
            raise ConsoleConfigError(f"--port {port} is not a port (0-65535).", option="--port")
        token = None
        if token_env is not None:
            token = (environ if environ is not None else os.environ).get(token_env, "").strip()
            if not token:
                raise ConsoleConfigError(
                    f"--token-env {token_env}: the variable is unset or empty; export a long"
                    f" random token first, e.g. export {token_env}=$(openssl rand -hex 24)",
                    option="--token-env",
                )
        if token is None and not is_loopback(host):
            raise ConsoleConfigError(
                f"--host {host} exposes the console beyond this machine: give a token with"
                " --token-env VAR (or bind 127.0.0.1 and use an SSH tunnel).",
                option="--host",
            )
        for url in ingest:
            if not url.startswith(("http://", "https://")):
                raise ConsoleConfigError(
                    f"--ingest {url!r} is not an http(s) URL: give the address `deltaflow"
                    " serve` listens on, e.g. --ingest http://127.0.0.1:8080",
                    option="--ingest",
                )
        return cls(roots=tuple(resolved), host=host, port=port, token=token, ingest=tuple(ingest))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
