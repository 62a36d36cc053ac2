# The two commands a fresh machine needs:  make demo  (topo-tune init on the embedded demo cluster)
#                                          make test  (lint, type-check and run every test)
# Both create the virtual environment and install everything on first use.

PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin

.PHONY: install demo test lint typecheck protos schema clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch for the gloo backend; pinned so no multi-GB CUDA build is pulled in.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev,agent]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/topo-tune init --cluster-config examples/demo-cluster.yaml --output topo-tune-output

lint: install
	$(BIN)/ruff check topo_tune tests tools benchmarks
	$(BIN)/ruff format --check topo_tune tests tools benchmarks
	$(BIN)/lint-imports

typecheck: install
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest

protos: install
	$(BIN)/python tools/gen_protos.py

schema: install
	$(BIN)/topo-tune config schema > docs/cluster.schema.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
