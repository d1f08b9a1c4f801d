"""Batch writes to Delta tables: file writing, the JVM and Python write paths, ``replaceWhere``."""
