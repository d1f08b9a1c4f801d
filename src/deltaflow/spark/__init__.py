"""The Spark layer: sessions, the ``delta`` data source and the DeltaTable API."""

from deltaflow.spark._session import register, session

__all__ = ["register", "session"]
