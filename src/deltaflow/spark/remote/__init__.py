"""``DeltaTable`` and its builders on a Spark Connect session: the client describes, the
server executes.

A Connect client may not see the server's disk, so nothing here opens table storage:
every method becomes one of Delta's SQL statements (``docs/sql.md``) sent with
``spark.sql``, which deltaflow's connector runs on the server. ``_sql_text`` writes
Connect ``Column`` expressions as exact SQL text (or refuses them), ``_table`` runs the
table's methods, ``_create`` the ``DeltaTableBuilder``.
"""
