# The two commands of the README. Both install what they need first (scripts/bootstrap.sh).
CONFIG ?= ray_configs/local.yaml
PYTEST_ARGS ?=
# The slowest tests of each run, so that a CI log says where its time went.
DURATIONS := --durations=15
# Processes for the tests that start no cluster: CI's machine has two cores.
TEST_WORKERS ?= 2
PARALLEL = -n $(TEST_WORKERS) --dist loadfile
VENV := .venv

.PHONY: setup run test test-multinode faults levers soak unit component lint model clean

setup:
	@bash scripts/bootstrap.sh

run: setup
	$(VENV)/bin/pdserve up --config $(CONFIG)

# The unit and component tests start no cluster: they run on TEST_WORKERS processes
# (pytest-xdist), each test file on one of them. The shared cluster's integration tests,
# then the quantized cluster, the bench commands' servers, the fault suite and the
# multi-node imitation each run a Ray cluster of their own: one after another, never
# beside. Their tests live in tests/integration (tests/conftest.py refuses them
# elsewhere), and only it is collected for them: the whole tree takes ~15 s more to
# collect, each time. scripts/test_phases.sh times each phase and prints the times at the
# end (also when one fails).
PYTEST := $(VENV)/bin/python -m pytest -ra $(DURATIONS)
test:
	@bash scripts/test_phases.sh \
	    "setup=bash scripts/bootstrap.sh" \
	    "lint=$(VENV)/bin/ruff check ." \
	    "unit+component=$(PYTEST) $(PARALLEL) tests/unit tests/component $(PYTEST_ARGS)" \
	    "integration=$(PYTEST) -m 'not multinode and not faults and not levers and not bench' tests/integration $(PYTEST_ARGS)" \
	    "levers=$(PYTEST) -m levers tests/integration $(PYTEST_ARGS)" \
	    "bench=$(PYTEST) -m bench tests/integration $(PYTEST_ARGS)" \
	    "faults=$(PYTEST) -m faults tests/integration $(PYTEST_ARGS)" \
	    "multinode=$(PYTEST) -m multinode tests/integration $(PYTEST_ARGS)"

# Faults injected into a running cluster (tests/integration/test_faults.py).
faults: setup
	$(VENV)/bin/python -m pytest -ra -m faults $(PYTEST_ARGS)

# The cost levers' own cluster: quantized weights and an fp8 KV cache through the pools.
levers: setup
	$(VENV)/bin/python -m pytest -ra -m levers $(PYTEST_ARGS)

# Steady mixed load while replicas and engines are killed and poison requests sent
# (tools/soak/run.py; docs/reliability.md, "Soak"). Not part of `make test`.
SOAK_MINUTES ?= 20
soak: setup
	$(VENV)/bin/python -m tools.soak.run --minutes $(SOAK_MINUTES) $(SOAK_ARGS)

test-multinode: setup
	$(VENV)/bin/python -m pytest -ra -s -m multinode $(PYTEST_ARGS)

# Pure tests: no Ray, torch, vLLM or subprocesses (tests/unit/test_purity.py keeps it so).
unit: setup
	$(VENV)/bin/python -m pytest -ra $(PARALLEL) tests/unit $(PYTEST_ARGS)

# One part against its real dependency (Serve's routing loop and schemas, Ray's autoscaler,
# torch, child processes), with no cluster started.
component: setup
	$(VENV)/bin/python -m pytest -ra $(PARALLEL) tests/component $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

model: setup
	$(VENV)/bin/pdserve model --config $(CONFIG)

clean:
	rm -rf .venv .cache .pytest_cache .ruff_cache
