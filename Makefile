# One command runs the service, one runs the tests; both set everything up from nothing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUN_STAMP := $(VENV)/.installed-runtime

.PHONY: run test check bench soak fuzz large lint clean audit browser java docs

$(STAMP): pyproject.toml client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./client
	$(BIN)/python -m pip install --quiet -e '.[dev,docs]'
	touch $(STAMP) $(RUN_STAMP)

# the runtime alone (no test tools); a venv `make test` made already has it
$(RUN_STAMP): pyproject.toml client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ./client
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $(RUN_STAMP)

run: $(RUN_STAMP) docs
	$(BIN)/privrelease standalone $(RUN_ARGS)

# the manual: docs/ built by MkDocs into site/ (not committed), which the service serves
# at /manual/; --strict fails on a broken link or anchor (not with --quiet, which hides
# the warnings that --strict counts). (The runtime's venv has mkdocs:
# a `make test` venv touches the runtime stamp too.)
docs: $(RUN_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# the console and /docs are tested in Debian's Chromium (never a downloaded browser)
browser:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; }

# the Spark engine's tests start a local Spark Connect server on Debian's OpenJDK 17
# (pyspark finds `java` on PATH; JAVA_HOME need not be set). Slim images drop the man
# folders, where the JRE's postinst links java.1.gz: it fails without them
java:
	command -v java >/dev/null || { mkdir -p /usr/share/man/man1 && apt-get update -qq && \
		apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }

lint: $(STAMP)
	$(BIN)/ruff check service workers mechanisms tests client examples
	$(BIN)/mypy

# the whole suite, as CI runs it: unit, tests/audit, integration, e2e (~11 min)
test: lint browser java docs
	$(BIN)/python -m pytest

# the quick loop (under 2 min on 2 cores): lint, then the unit tests without the slow ones;
# no Valkey, worker or browser. tests/audit and the `slow` unit tests run in `make test`.
check: lint
	$(BIN)/python -m pytest tests/unit -m "not slow" -q -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m pytest tests/bench -p no:cacheprovider -o addopts="" -s

# 64 clients x 2 minutes against a standalone service; checks budgets, releases and memory
soak: $(STAMP)
	$(BIN)/python -m tests.load.soak --clients 64 --seconds 120

# contract fuzzing at length (not CI; `make test` runs it with 5 examples per operation)
FUZZ_MAX_EXAMPLES ?= 100
fuzz: $(STAMP)
	FUZZ_MAX_EXAMPLES=$(FUZZ_MAX_EXAMPLES) $(BIN)/python -m pytest \
		tests/integration/test_contract_fuzz.py -p no:cacheprovider --timeout=7200

# 10^7-row CSV through the real service; prints memory peaks (not in CI: ~3 min, ~1 GB disk)
large: $(STAMP)
	$(BIN)/python -m tests.large.large_data $(LARGE_ARGS)

# adversarial privacy audit of every mechanism at full size; table in var/audit.md. Then
# the accuracy coverage suite at length (tests/coverage): every stated interval's level
# against simulation, table in var/coverage.md (docs/coverage.md shows the latest)
audit: $(STAMP)
	$(BIN)/python -m mechanisms.audit --size full --out var/audit.md
	PRIVRELEASE_COVERAGE_OUT=var/coverage.md $(BIN)/python -m pytest tests/coverage \
		-m coverage_full -q -p no:cacheprovider --timeout=7200

clean:
	rm -rf $(VENV) var site *.egg-info
