"""Delta's maintenance and inspection commands (DESCRIBE HISTORY / DETAIL, VACUUM,
RESTORE, OPTIMIZE, CONVERT TO DELTA, GENERATE): one implementation of each, without
pyspark, called by the SQL commands (through the bridge) and by ``deltaflow.DeltaTable``."""
