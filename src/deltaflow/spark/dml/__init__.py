"""``DeltaTable``: DELETE, UPDATE, MERGE, history and maintenance, delta-spark's API."""
