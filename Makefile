# kminer: every target installs what it needs into .venv on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
REPO   ?= examples/sample-repo
WORKDIR ?=
JOBS   ?=
ARGS   ?=
# the CPU build of torch (headers for compile checks); an unpinned torch would pull CUDA wheels
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup mine test test-fast lint fmt clean

$(BIN)/kminer: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/kminer

mine: setup
	$(BIN)/kminer mine $(REPO) $(if $(WORKDIR),--workdir $(WORKDIR)) $(if $(JOBS),--jobs $(JOBS)) $(ARGS)

# everything that runs without a GPU or an LLM endpoint (slow nvcc/torch-header tests included)
test: setup
	$(BIN)/python -m pytest -q -n 2 -m "not gpu and not llm" $(ARGS)

# the quick loop: pytest's default markers skip slow, gpu and llm tests
test-fast: setup
	$(BIN)/python -m pytest -q -n 2 $(ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: setup
	$(BIN)/ruff format .

clean:
	rm -rf runs .pytest_cache .ruff_cache
