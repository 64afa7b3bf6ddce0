# Calculet: `make run` serves on calsim, `make test` runs the whole suite, `make lint` checks style, types and import floors.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
RUN_DIR ?= run

.PHONY: run test lint unit integration soak fault-soak startup-loop protos clean install-units

$(STAMP): pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m calculet.ops.run_local --dir $(RUN_DIR)

# Workers for pytest-xdist; each hands out the longest tests first (tests/xdist_order.py) and work
# stealing balances what is left. Lint runs beside the tests (after them it added its whole time), at
# their priority: niced, a cold mypy (a clean clone, or sources changed) got so little CPU that it
# finished on one core after them. Its output follows the tests', and either failing fails the target.
# Its .mypy-src is made in its first second, long before a worker has collected. Five workers on 2 cores:
# while some wait on their processes the others have work (docs/performance.md, "The test suite's time":
# 192 % of CPU against 186 % with four, one more collection).
TEST_WORKERS ?= 5
# Every test starts hundreds of daemon, gateway and calctl processes; with PYTHONDONTWRITEBYTECODE set
# (as on these machines) each would compile our sources again (0.36 s of CPU a start): compile them once.
BYTECODE := $(PY) -m compileall -q daemon common client gateway ops protos tests
# pytest rewrites the asserts of each test module it imports and caches the result as a .pyc, but not
# under PYTHONDONTWRITEBYTECODE: then each worker rewrote every module again (10 s of CPU a worker, 60 %
# of its collection). One collection per test directory, at once, writes that cache; the workers read it.
# (It waits for its own collections only: `test` runs lint in the background meanwhile.) A tree whose cache
# is fresh skips them (tests/rewrite_cache.py).
REWRITTEN = $(PY) -m tests.rewrite_cache $(1) || { pids=; for dir in $(1); do PYTHONDONTWRITEBYTECODE= $(PY) -m pytest \
	-q --collect-only -p no:cacheprovider $$dir >/dev/null 2>&1 & pids="$$pids $$!"; done; wait $$pids; }

test: $(STAMP)
	@$(BYTECODE) >/dev/null
	@lint_log=$$(mktemp); \
	$(MAKE) --no-print-directory lint >$$lint_log 2>&1 & lint_pid=$$!; \
	$(call REWRITTEN,tests/unit tests/integration); \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal; tests=$$?; \
	wait $$lint_pid; linted=$$?; cat $$lint_log; rm -f $$lint_log; \
	echo "make test: pytest exit $$tests, lint exit $$linted"; \
	[ $$tests -eq 0 ] && [ $$linted -eq 0 ]

unit: $(STAMP)
	@$(BYTECODE) >/dev/null
	@$(call REWRITTEN,tests/unit)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal tests/unit

integration: $(STAMP)
	@$(BYTECODE) >/dev/null
	@$(call REWRITTEN,tests/integration)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal tests/integration

# The soak (issue 21): SOAK_DURATION of open-loop traffic under a fault cycle on what `make run` serves (qwen3-30b-a3b,
# time scale 1), every answer checked against a clean reference fleet; $(SOAK_DIR)/soak.json and soak.png, exit 0 on
# PASS (docs/reliability.md).
SOAK_DURATION ?= 30m
SOAK_DIR ?= soak-report
SOAK_LOAD ?= 0.7
soak: $(STAMP)
	$(PY) -m calculet.ops.calctl soak --duration $(SOAK_DURATION) --preset qwen3-30b-a3b --time-scale 1 \
		--load $(SOAK_LOAD) --out $(SOAK_DIR)

# The fault soak test at full size (issue 10): 300 requests at concurrency 16 (`make test` runs 48).
SOAK_REQUESTS ?= 300
fault-soak: $(STAMP)
	CALCULET_SOAK_REQUESTS=$(SOAK_REQUESTS) $(PY) -m pytest -q -s -m soak tests/integration

# Fleet start-ups in a loop under load (issue 21): 200 board + gateway start-ups, none may abort (`make test` runs 3).
STARTUP_LOOPS ?= 200
startup-loop: $(STAMP)
	CALCULET_STARTUP_LOOPS=$(STARTUP_LOOPS) $(PY) -m pytest -q -s -m startup_loop tests/integration

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	rm -rf .mypy-src && mkdir -p .mypy-src/calculet
	for d in common daemon client gateway ops; do ln -s ../../$$d .mypy-src/calculet/$$d; done
	ln -s ../../protos/calculet/v1 .mypy-src/calculet/v1
	$(VENV)/bin/mypy .mypy-src/calculet
	$(VENV)/bin/lint-imports --no-cache

# The systemd units and example configs under $(UNITS_PREFIX)/etc (root for /); ExecStart= runs this venv's commands.
UNITS_PREFIX ?= /
install-units: $(STAMP)
	$(VENV)/bin/calctl install-units --prefix $(UNITS_PREFIX)

protos: $(STAMP)
	$(PY) -m calculet.ops.protogen

clean:
	rm -rf $(VENV) build *.egg-info $(RUN_DIR)
