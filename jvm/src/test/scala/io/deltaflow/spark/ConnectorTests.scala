package io.deltaflow.spark

import java.nio.charset.StandardCharsets
import java.util.Base64

import scala.collection.mutable.ArrayBuffer

import org.apache.spark.paths.SparkPath
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.connector.read.PartitionReader
import org.apache.spark.sql.execution.datasources.{FilePartition, PartitionedFile}
import org.apache.spark.sql.sources._
import org.apache.spark.sql.types._

/**
 * Unit tests of the connector's JVM-only parts (no Spark session, no Python): run by
 * `tests/jvm/test_connector_units.py`, which compiles this file against the built jar.
 * ScalaTest is not in the pyspark wheel, so this is a plain runner that prints
 * `N passed, N failed` and exits 1 on any failure.
 */
object ConnectorTests {
  private val failures = ArrayBuffer.empty[String]
  private var passed = 0

  private def check(name: String)(body: => Unit): Unit =
    try { body; passed += 1 }
    catch { case e: Throwable => failures += s"$name: $e" }

  private def assertEq[T](actual: T, expected: T): Unit =
    if (actual != expected) throw new AssertionError(s"expected $expected, got $actual")

  def main(args: Array[String]): Unit = {
    check("comparisons become brain predicates") {
      assertEq(FilterJson.toJson(EqualTo("a", 3)).get.toString,
        """{"op":"=","column":["a"],"value":3}""")
      assertEq(FilterJson.toJson(GreaterThanOrEqual("`x.y`", "k")).get.toString,
        """{"op":">=","column":["x.y"],"value":"k"}""")
      assertEq(FilterJson.toJson(LessThan("s.inner", 2L)).get.toString,
        """{"op":"<","column":["s","inner"],"value":2}""")
    }
    check("dates, timestamps and decimals are tagged") {
      assertEq(FilterJson.toJson(EqualTo("d", java.time.LocalDate.of(2024, 1, 31))).get
        .get("value").toString, """{"date":"2024-01-31"}""")
      val instant = java.time.Instant.parse("2024-01-31T00:00:00.000001Z")
      assertEq(FilterJson.toJson(EqualTo("t", instant)).get.get("value").toString,
        """{"timestamp_us":1706659200000001}""")
      assertEq(FilterJson.toJson(EqualTo("m", new java.math.BigDecimal("12.50"))).get
        .get("value").toString, """{"decimal":"12.50"}""")
    }
    check("IN, IS NULL, OR and NOT of a comparison are pushed; NaN is not") {
      assertEq(FilterJson.toJson(In("a", Array(1, 2))).get.toString,
        """{"op":"in","column":["a"],"value":[1,2]}""")
      assertEq(FilterJson.toJson(Not(IsNull("a"))).get.toString,
        """{"op":"not","child":{"op":"is_null","column":["a"]}}""")
      assertEq(FilterJson.toJson(Or(EqualTo("a", 1), IsNull("a"))).get.toString,
        """{"op":"or","children":[{"op":"=","column":["a"],"value":1},""" +
          """{"op":"is_null","column":["a"]}]}""")
      assertEq(FilterJson.toJson(Or(And(EqualTo("a", 1), EqualTo("b", Double.NaN)),
        EqualTo("c", 2))).get.toString,
        """{"op":"or","children":[{"op":"=","column":["a"],"value":1},""" +
          """{"op":"=","column":["c"],"value":2}]}""")
      assertEq(FilterJson.convertible(Or(EqualTo("a", 1), EqualTo("b", Double.NaN))), false)
      assertEq(FilterJson.convertible(EqualTo("a", Double.NaN)), false)
      assertEq(FilterJson.convertible(Not(And(EqualTo("a", 1), EqualTo("b", 2)))), false)
    }
    check("column mapping: a pruned nested schema takes physical names") {
      val logical = StructType(Seq(
        StructField("id", LongType),
        StructField("s", StructType(Seq(StructField("a", IntegerType),
          StructField("b", StringType))))))
      val physical = StructType(Seq(
        StructField("col-1", LongType),
        StructField("col-2", StructType(Seq(StructField("col-3", IntegerType),
          StructField("col-4", StringType))))))
      val required = StructType(Seq(
        StructField("S", StructType(Seq(StructField("b", StringType))))))
      assertEq(SchemaMapping.physical(required, logical, physical),
        StructType(Seq(StructField("col-2", StructType(Seq(StructField("col-4", StringType)))))))
    }
    check("deleted rows are skipped per file, counting rows from each file's first") {
      val files = Array(file("a", 5), file("b", 3))
      val partition = DeltaInputPartition(FilePartition(0, files), Array(Array(0L, 3L),
        Array(2L)))
      val reader = new DeletedRowsReader(partition, f => rows(f.filePath.toString))
      val seen = ArrayBuffer.empty[String]
      while (reader.next()) seen += reader.get().getUTF8String(0).toString
      reader.close()
      assertEq(seen.toList, List("a1", "a2", "a4", "b0", "b1"))
    }
    check("a real-time reader's shared JobConf stays a JobConf through Spark's serializers") {
      val conf = new org.apache.hadoop.mapred.JobConf(false)
      conf.set("deltaflow.test", "kept")
      val sparkConf = new org.apache.spark.SparkConf()
      for (serializer <- Seq(new org.apache.spark.serializer.JavaSerializer(sparkConf),
          new org.apache.spark.serializer.KryoSerializer(sparkConf))) {
        val instance = serializer.newInstance()
        val back = instance.deserialize[org.apache.spark.util.SerializableConfiguration](
          instance.serialize(new SharedJobConf(conf)))
        // Spark's Parquet reader copies any other Configuration for every file it opens.
        assert(back.value.isInstanceOf[org.apache.hadoop.mapred.JobConf], back.value.getClass)
        assertEq(back.value.get("deltaflow.test"), "kept")
      }
    }
    check("a file read as batches gives every row of every batch, as UnsafeRows") {
      import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector
      import org.apache.spark.sql.vectorized.{ColumnVector, ColumnarBatch}
      def batch(values: Long*): ColumnarBatch = {
        val column = new OnHeapColumnVector(4, LongType)
        values.zipWithIndex.foreach { case (v, i) => column.putLong(i, v) }
        new ColumnarBatch(Array[ColumnVector](column), values.length)
      }
      val batches = Iterator(batch(1L, 2L), batch(), batch(3L))
      var closed = false
      val source = new PartitionReader[ColumnarBatch] {
        private var current: ColumnarBatch = _
        override def next(): Boolean = batches.hasNext && { current = batches.next(); true }
        override def get(): ColumnarBatch = current
        override def close(): Unit = closed = true
      }
      val attributes = org.apache.spark.sql.catalyst.types.DataTypeUtils.toAttributes(
        StructType(Seq(StructField("v", LongType))))
      val reader = new BatchRows(source,
        org.apache.spark.sql.catalyst.expressions.UnsafeProjection.create(attributes, attributes))
      val seen = ArrayBuffer.empty[Long]
      while (reader.next()) {
        assert(reader.get().isInstanceOf[org.apache.spark.sql.catalyst.expressions.UnsafeRow])
        seen += reader.get().getLong(0)
      }
      reader.close()
      assertEq(seen.toList, List(1L, 2L, 3L))
      assertEq(closed, true)
    }
    check("errors raised on the JVM carry a wire marker the Python side decodes") {
      val e = DeltaflowException.of("TableNotFoundError", "no table", Map("table_uri" -> "x"))
      val marker = """\[deltaflow-error:([A-Za-z0-9+/=]+)\]""".r
      val encoded = marker.findFirstMatchIn(e.getMessage).get.group(1)
      val payload = Brain.json.readTree(
        new String(Base64.getDecoder.decode(encoded), StandardCharsets.UTF_8))
      assertEq(payload.get("type").asText(), "TableNotFoundError")
      assertEq(payload.get("fields").get("table_uri").asText(), "x")
      assertEq(e.errorType, "TableNotFoundError")
    }
    check("a source offset carries row log positions; one without them (older) has none") {
      val brain = """{"sourceVersion":1,"reservoirId":"t","reservoirVersion":3,"index":-1,""" +
        """"isStartingVersion":false}"""
      val old = DeltaSourceOffset(brain.dropRight(1) + ""","rowsOfNextFile":2}""")
      assertEq(DeltaSourceOffset.split(old), (brain, 2L, Map.empty[String, (Long, Long)]))
      val withLog = DeltaSourceOffset.of(brain, 0L, Map("w/p1" -> (4L, 9L), "a%20b/p0" -> (1L, 0L)))
      assertEq(withLog.json, brain.dropRight(1) + ""","rowLog":{"a%20b/p0":[1,0],"w/p1":[4,9]}}""")
      assertEq(DeltaSourceOffset.split(withLog),
        (brain, 0L, Map("w/p1" -> (4L, 9L), "a%20b/p0" -> (1L, 0L))))
    }
    check("real-time commits: an average cap with bursts, not a fixed spacing") {
      val pacing = new org.apache.spark.sql.deltaflow.CommitPacing(50)
      val burst = org.apache.spark.sql.deltaflow.CommitPacing.Burst
      // After a quiet spell `burst` groups may start back to back, then one per interval.
      val at = 10000L
      (0 until burst).foreach { _ =>
        assert(pacing.nextStart <= at, s"${pacing.nextStart} > $at")
        pacing.start(at)
      }
      assertEq(pacing.nextStart, at + 50)
      pacing.start(at + 50)
      assertEq(pacing.nextStart, at + 100)
      // A query slower than its cap refills: 300 ms later the bucket is full again, so a
      // group goes at once and two more may follow it back to back.
      (0 until burst).foreach { _ =>
        assert(pacing.nextStart <= at + 400, s"${pacing.nextStart}")
        pacing.start(at + 400)
      }
      assertEq(pacing.nextStart, at + 450)
      // Whatever the starts, n groups span at least (n - burst) intervals.
      val p2 = new org.apache.spark.sql.deltaflow.CommitPacing(20)
      var now = 0L
      val starts = ArrayBuffer.empty[Long]
      (0 until 40).foreach { i =>
        now = math.max(now + (i % 7) * 3, p2.nextStart)
        p2.start(now)
        starts += now
      }
      for (i <- starts.indices; j <- i + burst until starts.size) {
        assert(starts(j) - starts(i) >= (j - i - burst + 1) * 20L, s"$i..$j: $starts")
      }
    }
    check("a real-time roll goes at its source's idle, else after the grace; not before the pacing") {
      import org.apache.spark.sql.deltaflow.{RealTimeCommits, RealTimeIdle}
      assertEq(RealTimeIdle.handOverDue(1000L, 2L, 0L, sourceIdle = false), 1002L)
      assertEq(RealTimeIdle.handOverDue(1000L, 2L, 0L, sourceIdle = true), 0L)
      assertEq(RealTimeIdle.handOverDue(1000L, 2L, 1500L, sourceIdle = true), 1500L)
      assertEq(RealTimeIdle.handOverDue(1000L, 2L, 1500L, sourceIdle = false), 1500L)
      assertEq(RealTimeCommits.graceMs(None), RealTimeCommits.GraceMs)
      assertEq(RealTimeCommits.graceMs(Some(" 250 ")), 250L)
      assertEq(RealTimeCommits.graceMs(Some("-1")), RealTimeCommits.GraceMs)
      assertEq(RealTimeCommits.graceMs(Some("soon")), RealTimeCommits.GraceMs)
      // The source's word reaches the writer of its own task attempt only, until forgotten.
      val heard = ArrayBuffer.empty[Boolean]
      RealTimeIdle.listen(7L, heard += _)
      RealTimeIdle.say(7L, idle = true)
      RealTimeIdle.say(8L, idle = false)
      RealTimeIdle.forget(7L)
      RealTimeIdle.say(7L, idle = false)
      assertEq(heard.toList, List(true))
    }
    check("real-time sources poll local tables every 2 ms, other stores every 10") {
      assertEq(RealTimePoll.defaultMs("file:/tmp/t"), 2L)
      assertEq(RealTimePoll.defaultMs("/tmp/t"), 2L)
      assertEq(RealTimePoll.defaultMs("s3a://bucket/t"), 10L)
      assertEq(RealTimePoll.defaultMs("abfss://c@a.dfs.core.windows.net/t"), 10L)
    }
    check("real-time readers turn vectored IO off on local tables unless the session sets it") {
      val session = new org.apache.hadoop.conf.Configuration(false)
      assertEq(RealTimePoll.readerConf("/tmp/t", session), Map(RealTimePoll.VectoredIo -> "false"))
      assertEq(RealTimePoll.readerConf("s3a://bucket/t", session), Map.empty[String, String])
      session.set(RealTimePoll.VectoredIo, "true")
      assertEq(RealTimePoll.readerConf("file:/tmp/t", session), Map.empty[String, String])
    }
    check("a read failing on a missing file raises its scan's signal and still fails") {
      import org.apache.spark.sql.deltaflow.{MissingFileSignal, MissingFileWatch}
      def failing(error: Throwable) = new PartitionReader[InternalRow] {
        override def next(): Boolean = throw error
        override def get(): InternalRow = null
        override def close(): Unit = ()
      }
      val signal = new MissingFileSignal("s3a://b/t")
      val other = new RuntimeException("not a missing file")
      val otherThrown = try { new MissingFileWatch(failing(other), signal).next(); null }
        catch { case e: Throwable => e }
      assertEq(otherThrown, other)
      assertEq(signal.isZero, true)
      // Spark's own wraps it (FAILED_READ_FILE.FILE_NOT_EXIST); a cause anywhere counts.
      val missing = new org.apache.spark.SparkException("read failed",
        new java.io.FileNotFoundException("s3a://b/t/part-0.parquet"))
      val thrown = try { new MissingFileWatch(failing(missing), signal).next(); null }
        catch { case e: Throwable => e }
      assertEq(thrown, missing)
      assertEq(signal.value.booleanValue, true)
    }
    check("a raised signal merged on the driver marks its table for the next brain request") {
      import org.apache.spark.sql.deltaflow.{MissingFileSignal, MissingFiles}
      MissingFiles.drain()
      val onDriver = new MissingFileSignal("s3a://b/t")
      onDriver.merge(new MissingFileSignal("s3a://b/t"))  // a task that found its files
      assertEq(MissingFiles.drain(), Nil)
      val fromTask = onDriver.copyAndReset().asInstanceOf[MissingFileSignal]
      assertEq(fromTask.isZero, true)
      fromTask.add(true)
      onDriver.merge(fromTask)
      assertEq(MissingFiles.drain(), List("s3a://b/t"))
      assertEq(MissingFiles.drain(), Nil)  // drained once
    }
    check("a task's rolled files close in the background, one at a time, errors at its commit") {
      import org.apache.spark.sql.deltaflow.BackgroundCloses
      val done = new java.util.concurrent.CopyOnWriteArrayList[String]()
      val started = System.nanoTime()
      BackgroundCloses.submit(7L, () => { Thread.sleep(200); done.add("first") })
      assertEq(done.isEmpty, true)  // submit returned before the close finished
      assertEq((System.nanoTime() - started) < 150000000L, true)
      BackgroundCloses.submit(7L, () => done.add("second"))
      assertEq(done.get(0), "first")  // the second close waited for the first
      BackgroundCloses.await(7L)
      assertEq(done.toArray.toList, List("first", "second"))
      BackgroundCloses.submit(8L, () => throw new java.io.IOException("upload refused"))
      val thrown = try { BackgroundCloses.await(8L); None } catch { case e: Throwable => Some(e) }
      assertEq(thrown.map(_.getMessage), Some("upload refused"))
      BackgroundCloses.await(8L)  // raised once
      BackgroundCloses.submit(9L, () => throw new java.io.IOException("gone"))
      BackgroundCloses.awaitQuietly(9L)  // an abort's wait raises nothing
      // A close after a failed one still runs (its file is closed for the abort to delete);
      // the earlier failure is raised at that submit.
      BackgroundCloses.submit(10L, () => throw new java.io.IOException("first failed"))
      Thread.sleep(50)
      val raised = try { BackgroundCloses.submit(10L, () => done.add("after")); None }
        catch { case e: Throwable => Some(e.getMessage) }
      assertEq(raised, Some("first failed"))
      BackgroundCloses.await(10L)
      assertEq(done.contains("after"), true)
    }

    check("the row log's appender writes synced, CRC-checked frames of at most 4096 rows") {
      import java.nio.{ByteBuffer, ByteOrder}
      import org.apache.spark.sql.catalyst.expressions.GenericInternalRow
      import org.apache.spark.sql.deltaflow.RowLogAppender
      import org.apache.spark.unsafe.types.UTF8String
      val dir = java.nio.file.Files.createTempDirectory("rowlog").resolve("w/p3")
      val schema = StructType(Seq(StructField("id", IntegerType), StructField("s", StringType)))
      val log = new RowLogAppender(dir.toString, 7L, schema, 3)
      // Rows 10.. of the epoch (an attempt that skipped 10 the table held).
      (10 until 5010).foreach { i =>
        log.append(new GenericInternalRow(Array[Any](i, UTF8String.fromString(s"r$i"))), i)
      }
      log.close(sync = true)
      val files = dir.toFile.listFiles().map(_.getName)
      assertEq(files.length, 1)
      assertEq(files.head.matches("""0{19}7-0{18}10-\d{13}-[0-9a-f]{8}\.arrows"""), true)
      val bytes = java.nio.file.Files.readAllBytes(dir.resolve(files.head))
      val buffer = ByteBuffer.wrap(bytes).order(ByteOrder.LITTLE_ENDIAN)
      var at = 0
      val frames = ArrayBuffer[(Long, Int)]()
      while (at < bytes.length) {
        assertEq(new String(bytes, at, 4, StandardCharsets.US_ASCII), "DFRL")
        val length = buffer.getInt(at + 4)
        val crc = new java.util.zip.CRC32()
        crc.update(bytes, at + 8, 12)
        crc.update(bytes, at + 24, length)
        assertEq(buffer.getInt(at + 20), crc.getValue.toInt)
        frames += ((buffer.getLong(at + 8), buffer.getInt(at + 16)))
        at += 24 + length
      }
      assertEq(at, bytes.length)
      // Contiguous positions from row 10; none over 4096 rows (the 1 ms linger may cut
      // frames sooner).
      assertEq(frames.head._1, 10L)
      frames.indices.drop(1).foreach(i => assertEq(frames(i)._1, frames(i - 1)._1 + frames(i - 1)._2))
      assertEq(frames.map(_._2).sum, 5000)
      assertEq(frames.forall(_._2 <= 4096), true)
    }
    check("row log frames: whole ones decode, a torn tail waits, damage before more is typed") {
      val seg = new java.io.File("/t/seg.arrows")
      val first = frame(0L, Seq(10L, 11L))
      val second = frame(2L, Seq(12L))
      val whole = first ++ second
      val got = RowLog.frames(whole ++ frame(3L, Seq(13L)).dropRight(1), 0L, seg, "t")
      assertEq(got.map(f => (f.fromRow, f.rows, f.end)),
        Seq((0L, 2L, first.length.toLong), (2L, 1L, whole.length.toLong)))
      assertEq(RowLog.frames(whole, 7L, seg, "t").head.end, 7L + first.length)
      val damaged = first.clone()
      damaged(30) = (damaged(30) ^ 1).toByte
      assertEq(RowLog.frames(damaged, 0L, seg, "t"), Seq.empty)  // a torn last frame
      val typed = try { RowLog.frames(damaged ++ second, 0L, seg, "t"); None }
        catch { case e: DeltaflowException => Some((e.errorType, e.fields.get("path"))) }
      assertEq(typed, Some(("CorruptTableError", Some(seg.toString))))
      val schema = StructType(Seq(StructField("id", LongType)))
      val decoder = new RowLogDecoder(schema, schema, "t")
      val (reader, batch) = decoder.decode(got.head, seg)
      assertEq((0 until batch.numRows()).map(batch.getRow(_).getLong(0)), Seq(10L, 11L))
      reader.close()
      val other = new RowLogDecoder(StructType(Seq(StructField("id", StringType))), schema, "t")
      val refused = try { other.decode(got.head, seg); None }
        catch { case e: DeltaflowException => Some(e.errorType) }
      assertEq(refused, Some("SourceSchemaChangedError"))
      decoder.close(); other.close()
    }
    check("row log: a position is read from its epoch's latest start at or before it") {
      def seg(epoch: Long, from: Long, created: Long) =
        RowLogSegment(new java.io.File(s"$epoch-$from-$created"), epoch, from, created, "0")
      val listed = Seq(seg(1, 0, 5), seg(1, 3, 9), seg(1, 3, 7), seg(1, 8, 10), seg(2, 0, 11))
      assertEq(RowLog.best(listed, RowLogPosition(1, 5)), Some(seg(1, 3, 9)))
      assertEq(RowLog.best(listed, RowLogPosition(1, 2)), Some(seg(1, 0, 5)))
      assertEq(RowLog.best(listed, RowLogPosition(3, 0)), None)
      assertEq(RowLog.parseTag("a%20b/p2/7/10-25"), ("a%20b/p2", 7L, 10L, 25L))
    }

    check("row log tails: each position once, a successor over a torn tail, a replay exactly") {
      val root = java.nio.file.Files.createTempDirectory("rowlog").toFile
      val dir = new java.io.File(root, "w/p0")
      dir.mkdirs()
      writeSegment(dir, 1, 0, 1000, frame(0, Seq(10, 11)), frame(2, Seq(12, 13, 14)),
        frame(5, Seq(15)).dropRight(3))  // its attempt died inside row 5's frame
      writeSegment(dir, 1, 3, 2000, frame(3, Seq(13, 14, 15)))  // the successor, from row 3
      writeSegment(dir, 2, 0, 3000, frame(0, Seq(20, 21)))
      val schema = StructType(Seq(StructField("id", LongType)))
      def drain(replayEnd: Option[Map[String, RowLogPosition]]) = {
        val tails = new RowLogTails(root, Map("w/p0" -> RowLogPosition(1, 1)), replayEnd,
          schema, schema, "t")
        val out = ArrayBuffer.empty[Long]
        while (tails.poll(_ => true)) {
          var row = tails.next()
          while (row.isDefined) { out += row.get.getLong(0); row = tails.next() }
        }
        val at = tails.positions("w/p0")
        tails.close()
        (out.toSeq, at)
      }
      assertEq(drain(None), (Seq(11L, 12L, 13L, 14L, 15L, 20L, 21L), RowLogPosition(2, 2)))
      assertEq(drain(Some(Map("w/p0" -> RowLogPosition(2, 1)))),
        (Seq(11L, 12L, 13L, 14L, 15L, 20L), RowLogPosition(2, 1)))
    }

    check("an epoch that ends short of rows it made visible is refused, in the table or the log") {
      import org.apache.spark.sql.deltaflow.{RealTimeCommits, RealTimeEpochEnd}
      val root = java.nio.file.Files.createTempDirectory("rowlog").toFile
      val dir = new java.io.File(root, "p0")
      dir.mkdirs()
      writeSegment(dir, 4, 0, 1000, frame(0, Seq(1, 2)), frame(2, Seq(3, 4, 5)),
        frame(5, Seq(6)).dropRight(3))  // a torn last frame does not count
      writeSegment(dir, 4, 3, 2000, frame(3, Seq(4)))
      writeSegment(dir, 5, 0, 3000, frame(0, Seq(7, 8, 9, 10, 11, 12, 13)))
      def epochSegments(epoch: Long) = RowLog.segments(dir).filter(_.epoch == epoch)
      assertEq(RowLog.loggedThrough(epochSegments(4)), 5L)
      assertEq(RowLog.loggedThrough(epochSegments(6)), 0L)
      val ended = Array[org.apache.spark.sql.connector.write.WriterCommitMessage](
        RealTimeCommits.Rows(0, 4), RealTimeCommits.Rows(1, 9))
      // Partition 0 ended at row 4: the table holds 3 of the epoch, its log reaches 5.
      assertEq(RealTimeEpochEnd.shortfalls(ended, Map(0 -> 3L, 1 -> 9L), _ => 5L),
        Seq((0, 4L, 5L)))
      assertEq(RealTimeEpochEnd.shortfalls(ended, Map(0 -> 6L, 1 -> 9L), _ => 0L),
        Seq((0, 4L, 6L)))
      assertEq(RealTimeEpochEnd.shortfalls(ended, Map(0 -> 4L), _ => 4L), Seq.empty)
      val refused = try {
        RealTimeEpochEnd.check("t", 4, ended, Map(0 -> 3L), Some(root.toString)); None
      } catch { case e: DeltaflowException => Some((e.errorType, e.getMessage.contains("5 of"))) }
      assertEq(refused, Some(("RealTimeEpochError", true)))
    }

    failures.foreach(f => System.err.println(s"FAILED $f"))
    println(s"$passed passed, ${failures.size} failed")
    if (failures.nonEmpty) sys.exit(1)
  }

  private val fileSizes = scala.collection.mutable.Map.empty[String, Int]

  /** A row log segment of `frames` in `dir`, named as the sink names it. */
  private def writeSegment(dir: java.io.File, epoch: Long, from: Long, created: Long,
      frames: Array[Byte]*): Unit =
    java.nio.file.Files.write(new java.io.File(dir,
      RowLog.segmentName(epoch, from, created, 10)).toPath, frames.reduce(_ ++ _))

  /** A row log frame of `ids` (`_rowlog.encode_frame`): header, then an Arrow IPC stream. */
  private def frame(fromRow: Long, ids: Seq[Long]): Array[Byte] = {
    val allocator = new org.apache.arrow.memory.RootAllocator(Long.MaxValue)
    val vector = new org.apache.arrow.vector.BigIntVector("id", allocator)
    ids.zipWithIndex.foreach { case (v, i) => vector.setSafe(i, v) }
    vector.setValueCount(ids.size)
    val root = org.apache.arrow.vector.VectorSchemaRoot.of(vector)
    val bytes = new java.io.ByteArrayOutputStream()
    val writer = new org.apache.arrow.vector.ipc.ArrowStreamWriter(root, null, bytes)
    writer.start(); writer.writeBatch(); writer.end(); writer.close()
    root.close(); allocator.close()
    val payload = bytes.toByteArray
    val covered = java.nio.ByteBuffer.allocate(12).order(java.nio.ByteOrder.LITTLE_ENDIAN)
      .putLong(fromRow).putInt(ids.size).array()
    val crc = new java.util.zip.CRC32()
    crc.update(covered); crc.update(payload)
    java.nio.ByteBuffer.allocate(RowLog.HeaderSize + payload.length)
      .order(java.nio.ByteOrder.LITTLE_ENDIAN).put("DFRL".getBytes(StandardCharsets.US_ASCII))
      .putInt(payload.length).put(covered).putInt(crc.getValue.toInt).put(payload).array()
  }

  private def file(name: String, rowCount: Int): PartitionedFile = {
    fileSizes(s"file:/t/$name") = rowCount
    PartitionedFile(InternalRow.empty, SparkPath.fromUrlString(s"file:/t/$name"), 0, 10,
      Array.empty[String], 0L, 10L, Map.empty)
  }

  private def rows(path: String): PartitionReader[InternalRow] = new PartitionReader[InternalRow] {
    private val name = path.stripPrefix("file:/t/")
    private val count = fileSizes(path)
    private var i = -1
    override def next(): Boolean = { i += 1; i < count }
    override def get(): InternalRow =
      InternalRow(org.apache.spark.unsafe.types.UTF8String.fromString(s"$name$i"))
    override def close(): Unit = ()
  }
}
