package org.apache.spark.sql.deltaflow

import java.util.UUID

import scala.reflect.ClassTag
import scala.util.control.NonFatal

import org.apache.spark.SparkEnv
import org.apache.spark.rpc.{RpcCallContext, RpcEndpointRef, RpcEnv, ThreadSafeRpcEndpoint}
import org.apache.spark.util.RpcUtils

/**
 * The driver's side of deltaflow's real-time source: an RPC endpoint in the driver's
 * `RpcEnv` that answers a real-time reader's "which files come after my position?"
 * with `answer` (which asks the brain). Spark's RPC because every executor reaches its
 * driver, on `local`, `local-cluster`, standalone, YARN or Kubernetes alike, while the
 * brain is a process of the driver's host that executors elsewhere cannot reach.
 */
class RealTimeFilesEndpoint(answer: String => AnyRef) extends ThreadSafeRpcEndpoint {
  override val rpcEnv: RpcEnv = SparkEnv.get.rpcEnv

  override def receiveAndReply(context: RpcCallContext): PartialFunction[Any, Unit] = {
    case RealTimeFilesEndpoint.Next(after) =>
      try context.reply(answer(after))
      catch { case NonFatal(e) => context.sendFailure(e) }
  }
}

object RealTimeFilesEndpoint {
  /** A reader at position `after` (the brain's offset JSON) asks for what follows. */
  case class Next(after: String)

  /** Where an executor finds the endpoint. */
  case class Address(name: String, host: String, port: Int)

  /** The endpoint registered on the driver, and how to take it down. */
  def start(answer: String => AnyRef): (Address, () => Unit) = {
    val endpoint = new RealTimeFilesEndpoint(answer)
    val name = s"deltaflow-realtime-${UUID.randomUUID()}"
    val ref = endpoint.rpcEnv.setupEndpoint(name, endpoint)
    (Address(name, ref.address.host, ref.address.port), () => endpoint.rpcEnv.stop(ref))
  }

  /** A reference to the endpoint at `address`, from a task. */
  def connect(address: Address): RpcEndpointRef =
    RpcUtils.makeDriverRef(address.name, address.host, address.port, SparkEnv.get.rpcEnv)

  def ask[T: ClassTag](ref: RpcEndpointRef, after: String): T = ref.askSync[T](Next(after))
}
