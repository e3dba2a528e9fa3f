# One command runs the service, one runs the tests; both set everything up from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test bench large lint clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/privrelease standalone

test: $(STAMP)
	$(BIN)/ruff check service workers mechanisms tests
	$(BIN)/mypy
	$(BIN)/python -m pytest

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m pytest tests/bench -p no:cacheprovider -o addopts="" -s

# 10^7-row CSV through the real service; prints memory peaks (not in CI: ~3 min, ~1 GB disk)
large: $(STAMP)
	$(BIN)/python -m tests.large.large_data $(LARGE_ARGS)

clean:
	rm -rf $(VENV) var *.egg-info
