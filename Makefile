# deltaflow: `make demo` runs the main job, `make test` runs every test plus ruff and mypy.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench check-java clean

check-java:
	@command -v java >/dev/null 2>&1 || { \
	  echo "deltaflow needs Java 17 or newer for Spark."; \
	  echo "Install it, e.g.: sudo apt-get install -y openjdk-17-jre-headless  (Debian/Ubuntu)"; \
	  echo "               or: brew install openjdk@17                          (macOS)"; \
	  exit 1; }

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: check-java $(STAMP)
	$(PY) demo/main_job.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench demo
	$(VENV)/bin/mypy

test: check-java $(STAMP) lint
	$(PY) -m pytest

bench: check-java $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache data
