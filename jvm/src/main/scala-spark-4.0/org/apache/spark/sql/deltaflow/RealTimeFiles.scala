package org.apache.spark.sql.deltaflow

// Spark 4.0 has no real-time mode, so the real-time source's driver endpoint
// (`scala-spark-4.1+/.../RealTimeFiles.scala`, which also uses 4.1's RPC helpers) has no
// counterpart here: this file keeps every versioned path present for every minor.
