# gpugap: `make help` lists the targets. Every target sets up what it needs on a fresh machine.
PY ?= python3
VENV ?= .venv
# pytest-xdist workers (files stay whole: tests/conftest.py): the tests mostly wait on
# real services, so more workers than cores
TEST_WORKERS ?= 3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: help venv test lint demo bench services-up services-down clean protos

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP) ## create .venv with gpugap and its dev tools

test: $(STAMP) ## run the test suite (starts a local Kafka broker if none is given)
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
	  echo "tests/web needs Debian's chromium: apt-get install chromium"
	$(BIN)/gpugap services fetch
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

lint: $(STAMP) ## ruff, mypy and the import-layer contract (import-linter, pyproject.toml)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

demo: $(STAMP) ## run the demo on the embedded defaults (DURATION=seconds, default until Ctrl-C)
	$(BIN)/gpugap services fetch
	$(BIN)/gpugap demo $(if $(DURATION),--duration $(DURATION),)

bench: $(STAMP) ## codec and broker throughput beside plain baselines (python -m benchmarks --help: the rest)
	$(BIN)/python -m benchmarks all

services-up: $(STAMP) ## start the local Kafka broker (127.0.0.1:9092)
	$(BIN)/gpugap services up

services-down: $(STAMP) ## stop the local Kafka broker
	$(BIN)/gpugap services down

protos: $(STAMP) ## regenerate the kubelet PodResources stubs from producers/nvml/kubelet/api.proto
	$(BIN)/python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. --grpc_python_out=. \
		gpugap/producers/nvml/kubelet/api.proto  # through the link: imports name gpugap.producers

clean: ## remove the virtualenv and caches (the Kafka jar cache stays)
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
