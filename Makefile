# make demo: set up .venv and run the default pipeline on the embedded phantom dataset.
# make test: set up .venv and run the test suite (what CI runs).
# make test-fast: the developer loop, without the tests marked slow (no workflow runs; a few minutes on 2 cores).
# make report: the HTML report of the finished default run (results/report.html; `retinabench report` runs
#   snakemake --report and escapes the report's inline data: docs/report.md), then opened in headless Chromium to check
#   that every section renders its figures (needs the Debian packages chromium and chromium-driver).
# make lint: ruff, snakefmt --check, envs/ against requirements.lock, mypy on src/, the import contracts of
#   pyproject.toml (lint-imports), snakemake --lint (CI runs it before the tests).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install bench clean report

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

demo: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/snakemake --profile profiles/local all
	@echo "results: results/metrics.parquet, results/analysis/rank_summary.csv, results/figures/"

report: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m retinabench report results/report.html --profile profiles/local
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m retinabench.report_check results/report.html
	@echo "report: results/report.html"

test: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q -ra

test-fast: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q -ra -m "not slow"

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench workflow envs
	$(VENV)/bin/snakefmt --check workflow Snakefile
	$(PY) envs/sync.py --check
	$(VENV)/bin/mypy src
	$(VENV)/bin/lint-imports
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/snakemake --lint

bench: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) bench/run_all.py

clean:
	rm -rf results .snakemake
