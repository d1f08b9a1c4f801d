"""Where the catalog lives: Spark's Hive metastore, on embedded Derby or a shared database.

Every deltaflow host (``deltaflow.session()``, ``deltaflow sql-server``, and ``spark-sql`` /
Connect / Thrift servers started with ``deltaflow.spark_conf()``) keeps its schemas and
tables in Spark's Hive metastore (``spark.sql.catalogImplementation=hive``; the Hive 2.3
client, DataNucleus and Derby are in the pyspark wheel), so they survive a restart:

- by default on **embedded Derby** in ``<warehouse>/_metastore/metastore_db`` (one
  metastore per warehouse: the ``default`` database's location is recorded in the
  metastore, so two warehouses must never share one). Embedded Derby admits one process at
  a time; the connector names the process holding it (``MetastoreInUseError``);
- on a **shared database** (PostgreSQL, MySQL, ...) when ``DELTAFLOW_METASTORE_URL`` names
  one, for many processes at once. The environment is read here and nowhere else:

  ``DELTAFLOW_METASTORE_URL``       the JDBC URL (``jdbc:postgresql://host:5432/metastore``)
  ``DELTAFLOW_METASTORE_JARS``      the JDBC driver's jar(s), separated by ``os.pathsep``
  ``DELTAFLOW_METASTORE_USER``      the database user
  ``DELTAFLOW_METASTORE_PASSWORD``  its password
  ``DELTAFLOW_METASTORE_DRIVER``    the driver class, when the URL's kind is not known here

Spark settings given by the user always win: ``spark.sql.catalogImplementation=in-memory``
opts out (a catalog that lives as long as the session), and
``spark.hadoop.javax.jdo.option.ConnectionURL`` (with Hive's other ``javax.jdo.option.*``
keys) picks any metastore database directly.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

from deltaflow.errors import InvalidOptionError

CATALOG_IMPLEMENTATION = "spark.sql.catalogImplementation"
WAREHOUSE = "spark.sql.warehouse.dir"
_JDO = "spark.hadoop.javax.jdo.option."
CONNECTION_URL = _JDO + "ConnectionURL"
CONNECTION_DRIVER = _JDO + "ConnectionDriverName"
CONNECTION_USER = _JDO + "ConnectionUserName"
CONNECTION_PASSWORD = _JDO + "ConnectionPassword"
# The directory under the warehouse that holds the embedded metastore (and Derby's log).
METASTORE_DIR = "_metastore"
DERBY_DATABASE = "metastore_db"
# Spark's default warehouse, relative to the host's working directory.
DEFAULT_WAREHOUSE = "spark-warehouse"

# Hive creates its metastore tables on first use, in any database; no schema version check
# (Hive's schematool is not in the wheel, and the schema is the one this Hive client makes).
_SCHEMA_SETTINGS = {
    "spark.hadoop.datanucleus.schema.autoCreateAll": "true",
    "spark.hadoop.hive.metastore.schema.verification": "false",
}

# On a shared database, every metastore table is created when the metastore opens, never
# lazily. Lazily, DataNucleus creates a table the first time Hive persists its class, on a
# connection of its own, while Hive's transaction is open on another: the first CREATE TABLE
# on a fresh PostgreSQL metastore persists the table's privileges (TBL_PRIVS), whose
# foreign key to TBLS waits for the lock the same process's open INSERT INTO TBLS holds,
# forever (a deadlock inside one JVM, which PostgreSQL cannot see). DataNucleus's "Classes"
# auto-start adds every persistent class of Hive 2.3's model (package.jdo in
# hive-metastore-2.3.*.jar, in the pyspark wheel; the embedded-only classes have no table)
# as the store starts, outside any transaction: creating the missing tables once, checking
# them afterwards. Embedded Derby keeps the lazy creation it has always had (one process at
# a time; its DDL does not wait on its own open transaction this way).
HIVE_MODEL_PACKAGE = "org.apache.hadoop.hive.metastore.model"
HIVE_MODEL_CLASSES = (
    "MDatabase",
    "MType",
    "MTable",
    "MConstraint",
    "MSerDeInfo",
    "MColumnDescriptor",
    "MStringList",
    "MStorageDescriptor",
    "MPartition",
    "MIndex",
    "MRole",
    "MRoleMap",
    "MGlobalPrivilege",
    "MDBPrivilege",
    "MTablePrivilege",
    "MPartitionPrivilege",
    "MTableColumnPrivilege",
    "MPartitionColumnPrivilege",
    "MPartitionEvent",
    "MMasterKey",
    "MDelegationToken",
    "MTableColumnStatistics",
    "MPartitionColumnStatistics",
    "MVersionTable",
    "MFunction",
    "MNotificationLog",
    "MNotificationNextId",
)
_EAGER_SCHEMA_SETTINGS = {
    "spark.hadoop.datanucleus.autoStartMechanism": "Classes",
    "spark.hadoop.datanucleus.autoStartClassNames": ",".join(
        f"{HIVE_MODEL_PACKAGE}.{name}" for name in HIVE_MODEL_CLASSES
    ),
}

ENV_URL = "DELTAFLOW_METASTORE_URL"
ENV_JARS = "DELTAFLOW_METASTORE_JARS"
ENV_USER = "DELTAFLOW_METASTORE_USER"
ENV_PASSWORD = "DELTAFLOW_METASTORE_PASSWORD"
ENV_DRIVER = "DELTAFLOW_METASTORE_DRIVER"

_DRIVERS = {
    "postgresql": "org.postgresql.Driver",
    "mysql": "com.mysql.cj.jdbc.Driver",
    "mariadb": "org.mariadb.jdbc.Driver",
    "sqlserver": "com.microsoft.sqlserver.jdbc.SQLServerDriver",
    "oracle": "oracle.jdbc.OracleDriver",
}


@dataclass(frozen=True)
class SharedMetastore:
    """A metastore database many processes share (``DELTAFLOW_METASTORE_*``)."""

    url: str
    driver: str
    jars: tuple[str, ...] = ()
    user: str | None = None
    password: str | None = None

    def __repr__(self) -> str:  # the password is never printed
        return f"SharedMetastore(url={self.url!r}, driver={self.driver!r}, jars={self.jars!r})"


def shared_metastore(environ: Mapping[str, str] | None = None) -> SharedMetastore | None:
    """The shared metastore the environment names, or None (embedded Derby)."""
    env = os.environ if environ is None else environ
    url = env.get(ENV_URL, "").strip()
    if not url:
        return None
    if not url.startswith("jdbc:"):
        raise InvalidOptionError(
            f"{ENV_URL}={url!r} is not a JDBC URL. Set it to the metastore database's JDBC"
            " URL, e.g. jdbc:postgresql://host:5432/metastore.",
            option=ENV_URL,
        )
    kind = url.split(":", 2)[1].lower()
    driver = env.get(ENV_DRIVER, "").strip() or _DRIVERS.get(kind)
    if not driver:
        raise InvalidOptionError(
            f"deltaflow does not know the JDBC driver class for {kind!r} URLs ({ENV_URL}). Set"
            f" {ENV_DRIVER} to the driver's class name.",
            option=ENV_DRIVER,
            valid=tuple(_DRIVERS),
        )
    jars = tuple(j for j in env.get(ENV_JARS, "").split(os.pathsep) if j.strip())
    for jar in jars:
        if not os.path.isfile(jar):
            raise InvalidOptionError(
                f"{ENV_JARS} names {jar!r}, which is not a file. Point it at the JDBC driver's"
                f" jar (for PostgreSQL: postgresql-<version>.jar from"
                " https://jdbc.postgresql.org/download/).",
                option=ENV_JARS,
            )
    return SharedMetastore(
        url=url,
        driver=driver,
        jars=tuple(os.path.abspath(j) for j in jars),
        user=env.get(ENV_USER) or None,
        password=env.get(ENV_PASSWORD) or None,
    )


def metastore_dir(warehouse: str | None) -> str:
    """The directory of the embedded metastore that belongs to ``warehouse`` (Spark's
    ``spark.sql.warehouse.dir``; None: Spark's default, relative to the working directory).

    ``<warehouse>/_metastore`` for a local warehouse. A warehouse on an object store cannot
    hold a Derby database: its metastore is local, under
    ``$XDG_DATA_HOME/deltaflow/metastores/<hash of the warehouse URI>``.
    """
    if warehouse is None:
        return os.path.join(DEFAULT_WAREHOUSE, METASTORE_DIR)
    local = _local_path(warehouse)
    if local is not None:
        return os.path.join(local, METASTORE_DIR)
    data_home = os.environ.get("XDG_DATA_HOME") or os.path.join(
        os.path.expanduser("~"), ".local", "share"
    )
    digest = hashlib.sha1(warehouse.rstrip("/").encode()).hexdigest()[:16]
    return os.path.join(data_home, "deltaflow", "metastores", digest)


def _local_path(location: str) -> str | None:
    if location.startswith("file://"):
        return location[len("file://") :] or "/"
    if location.startswith("file:"):
        return location[len("file:") :]
    if "://" in location or (":" in location.split("/")[0] and len(location.split(":")[0]) > 1):
        return None
    return location


def derby_url(directory: str) -> str:
    """The embedded Derby metastore in ``directory``, created on first use."""
    return f"jdbc:derby:;databaseName={os.path.join(directory, DERBY_DATABASE)};create=true"


@dataclass(frozen=True)
class CatalogSettings:
    """What a host needs for the persistent catalog: Spark settings (added under the
    user's own), driver jars for the class path, and the embedded metastore's directory
    (None for a shared database, the user's own URL, or an in-memory catalog)."""

    conf: dict[str, str]
    jars: tuple[str, ...] = ()
    derby_dir: str | None = None


def catalog_settings(
    given: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> CatalogSettings:
    """The catalog settings for a host whose Spark settings so far are ``given``: the
    Hive catalog on the shared database the environment names, or on embedded Derby under
    the warehouse; nothing for an in-memory catalog. Keys in ``given`` are never changed."""
    implementation = given.get(CATALOG_IMPLEMENTATION, "hive").strip().lower()
    if implementation != "hive":
        return CatalogSettings(conf={})
    conf = {CATALOG_IMPLEMENTATION: "hive", **_SCHEMA_SETTINGS}
    jars: tuple[str, ...] = ()
    derby_dir = None
    if CONNECTION_URL in given:
        pass  # the user's own metastore database
    elif (shared := shared_metastore(environ)) is not None:
        conf[CONNECTION_URL] = shared.url
        conf[CONNECTION_DRIVER] = shared.driver
        if shared.user is not None:
            conf[CONNECTION_USER] = shared.user
        if shared.password is not None:
            conf[CONNECTION_PASSWORD] = shared.password
        jars = shared.jars
    else:
        derby_dir = metastore_dir(given.get(WAREHOUSE))
        conf[CONNECTION_URL] = derby_url(derby_dir)
    url = given.get(CONNECTION_URL, conf.get(CONNECTION_URL, ""))
    if url and not url.startswith("jdbc:derby:"):
        conf.update(_EAGER_SCHEMA_SETTINGS)
    return CatalogSettings(
        conf={k: v for k, v in conf.items() if k not in given}, jars=jars, derby_dir=derby_dir
    )
