"""The web console: a read-only view of the Delta tables under some directories.

``deltaflow console ROOT...`` serves HTML pages and the JSON API behind them
(docs/console.md). Nothing here writes to a table.
"""

from deltaflow.console._config import ConsoleConfig
from deltaflow.console._server import ConsoleServer, serve_console

__all__ = ["ConsoleConfig", "ConsoleServer", "serve_console"]
