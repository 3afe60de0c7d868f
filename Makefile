# make demo: set up .venv and run the default pipeline on the embedded phantom dataset.
# make test: set up .venv and run the test suite (what CI runs).
# make report: the HTML report of the finished default run (results/report.html), then opened in headless Chromium
#   to check that every section renders its figures (needs the Debian packages chromium and chromium-driver).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test install bench clean report

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
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/snakemake --profile profiles/local --report results/report.html
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m retinabench.report_check results/report.html
	@echo "report: results/report.html"

test: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pytest -q -ra

bench: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) bench/run_all.py

clean:
	rm -rf results .snakemake
