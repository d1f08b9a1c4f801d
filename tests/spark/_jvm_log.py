"""A JVM logger's lines in a file while a block of a test runs (log4j2, the driver JVM).

deltaflow's sessions log WARN and above to stderr, which the JVM inherited at launch, so a
test cannot capture it; this adds a file appender at INFO to one logger (and its children)
for the block, then takes it off and puts the logger's configuration back. In ``local`` mode the
executors are the driver JVM, so their task-side lines land in the file too.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def jvm_log_lines(spark: Any, logger: str, path: Path) -> Iterator[Callable[[], list[str]]]:
    """Yields a function returning the messages ``logger`` logged so far (one per line)."""
    log4j = spark._jvm.org.apache.logging.log4j
    configurator = log4j.core.config.Configurator
    context = log4j.LogManager.getContext(False)
    config = context.getConfiguration()
    own = config.getLoggerConfig(logger).getName() == logger  # configured by name already
    before = config.getLoggerConfig(logger).getLevel() if own else None
    layout = log4j.core.layout.PatternLayout.newBuilder().withPattern("%m%n").build()
    name = f"deltaflow-test-{uuid.uuid4().hex}"
    appender = (
        log4j.core.appender.FileAppender.newBuilder()
        .withFileName(str(path))
        .setName(name)
        .setLayout(layout)
        .build()
    )
    appender.start()
    configurator.setLevel(logger, log4j.Level.INFO)
    config.addAppender(appender)
    config.getLoggerConfig(logger).addAppender(appender, None, None)
    context.updateLoggers()

    def lines() -> list[str]:
        return path.read_text().splitlines() if path.exists() else []

    try:
        yield lines
    finally:
        config.getLoggerConfig(logger).removeAppender(name)
        if own:
            configurator.setLevel(logger, before)
        else:  # the logger inherits from its parents again, as before
            config.removeLogger(logger)
            context.updateLoggers()
        appender.stop()
