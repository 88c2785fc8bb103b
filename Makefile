# The two commands of the README. Both install what they need first (scripts/bootstrap.sh).
CONFIG ?= ray_configs/local.yaml
PYTEST_ARGS ?=
VENV := .venv

.PHONY: setup run test unit lint model clean

setup:
	@bash scripts/bootstrap.sh

run: setup
	$(VENV)/bin/pdserve up --config $(CONFIG)

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/python -m pytest -ra $(PYTEST_ARGS)

unit: setup
	$(VENV)/bin/python -m pytest -ra tests/unit $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

model: setup
	$(VENV)/bin/pdserve model --config $(CONFIG)

clean:
	rm -rf .venv .cache .pytest_cache .ruff_cache
