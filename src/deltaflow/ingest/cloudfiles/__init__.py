"""The ``cloudFiles`` source: Auto Loader-style ingestion of files dropped in a landing zone."""
