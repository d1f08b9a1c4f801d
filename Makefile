# deltaflow: `make demo` runs the main job, `make test` runs every test plus ruff and mypy.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-spark-versions lint bench bench-reference check-java browser postgres clean jar

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "deltaflow needs Java 17 or newer for Spark."; \
	  echo "Install it, e.g.: sudo apt-get install -y openjdk-17-jre-headless  (Debian/Ubuntu)"; \
	  echo "               or: brew install openjdk@17                          (macOS)"; \
	  exit 1; }

# Headless Chromium for the console's browser tests (tests/console/): Debian's package,
# installed when we are root, otherwise a message with the command to run.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium chromium-driver; \
	  else \
	    echo "The console's browser tests need Chromium (headless)."; \
	    echo "Install it, e.g.: sudo apt-get install -y chromium chromium-driver  (Debian/Ubuntu)"; \
	    exit 1; \
	  fi; }

# PostgreSQL's server programs for the shared-metastore tests (tests/_postgres.py starts a
# private cluster): Debian's package, installed when we are root, otherwise a message.
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || command -v pg_ctl >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y postgresql; \
	  else \
	    echo "The shared-metastore tests need PostgreSQL's server programs (initdb, pg_ctl)."; \
	    echo "Install them, e.g.: sudo apt-get install -y postgresql  (Debian/Ubuntu)"; \
	    exit 1; \
	  fi; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

# The JVM connector, compiled with the Scala compiler inside the pyspark wheel; rebuilt
# only when its sources or the pyspark version change (deltaflow/spark/_jar.py).
jar: check-java $(STAMP)
	$(PY) -m deltaflow.spark._jar

# `make demo CONSOLE=1` leaves the web console up at the end (http://127.0.0.1:8765/).
# `make demo STORAGE=s3` puts the tables on a SeaweedFS S3 gateway the demo starts and stops,
# with Hadoop's S3A jars (resolved from Maven Central by the tests' harness, cached; as a
# cluster with hadoop-aws has them) so checkpoints and the landing zone go there too;
# `make demo STORAGE=s3 S3A=0` runs it without them (deltaflow's Python path on S3).
demo: jar
	$(PY) demo/main_job.py $(if $(CONSOLE),--console) $(if $(STORAGE),--storage $(STORAGE)) \
		$(if $(filter s3,$(STORAGE)),$(if $(filter 0,$(S3A)),,--s3a-jars "$$($(PY) -m tests._s3a)"))

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench demo
	$(VENV)/bin/ruff format --check src tests bench demo
	$(VENV)/bin/mypy

# Two test processes, whole files to each (module fixtures stay in one process); then the
# core suite on the newest patch of each older Spark 4.x minor (tests/spark_versions.py:
# OLDER_SPARK, CORE_TESTS), each in a side venv that holds only that pyspark (~1 min to make
# on a fresh machine, cached under ~/.cache/deltaflow/spark-versions/) and ~4-5 min to run.
# CI_SPARK_VERSIONS="4.0.5" (say) runs fewer. Figures and CI's budget: docs/architecture.md,
# "Every Spark 4.x".
CI_SPARK_VERSIONS ?=
test: jar browser postgres lint
	$(PY) -m pytest -n 2 --dist loadfile --no-loadscope-reorder
	$(PY) tests/spark_versions.py $(CI_SPARK_VERSIONS)

# The core suite alone, on every older minor (or VERSIONS="4.1.4 ...").
test-spark-versions: check-java $(STAMP)
	$(PY) tests/spark_versions.py $(VERSIONS)

bench: jar
	$(PY) bench/run_all.py

# deltaflow next to delta-spark on one Spark version (bench/reference/run.py;
# SCALE=small|large), not part of
# `make test` or `make bench`: it builds the reference environment (tests/reference/_env.py).
bench-reference: jar
	$(PY) bench/reference/run.py --scale $(or $(SCALE),small) --same-spark

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache data src/deltaflow/_jvm
