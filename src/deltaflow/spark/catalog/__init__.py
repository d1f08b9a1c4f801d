"""Catalog tables: ``saveAsTable``, ``INSERT INTO`` and the ``DeltaTable`` builder."""
