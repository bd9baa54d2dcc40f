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
# Debian packages the tests drive: chromium (the review UI in a browser), PostgreSQL (a store by
# URL), bubblewrap (the execution boundary's namespaces), python3 (a system interpreter the
# boundary's fallback can run as a uid of its own)
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup system-deps mine test test-fast wheel-test lint fmt clean

$(BIN)/kminer: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

setup: $(BIN)/kminer

system-deps:
	@missing=""; \
	{ command -v chromium || test -x /usr/lib/chromium/chromium; } >/dev/null || missing="$$missing chromium"; \
	{ command -v initdb || ls /usr/lib/postgresql/*/bin/initdb; } >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	test -f /usr/include/eigen3/Eigen/Dense || missing="$$missing libeigen3-dev"; \
	test -x /usr/bin/python3 || missing="$$missing python3"; \
	if [ -n "$$missing" ]; then \
	  echo "installing$$missing (apt-get)"; \
	  $(SUDO) apt-get install -y -q $$missing >/dev/null 2>&1 \
	    || { $(SUDO) apt-get update -q >/dev/null && $(SUDO) apt-get install -y -q $$missing >/dev/null; }; \
	fi

mine: setup
	$(BIN)/kminer mine $(REPO) $(if $(WORKDIR),--workdir $(WORKDIR)) $(if $(JOBS),--jobs $(JOBS)) $(ARGS)

# everything that runs without a GPU or an LLM endpoint (slow nvcc/torch-header tests included)
test: setup system-deps
	$(BIN)/python -m pytest -q -n 2 -m "not gpu and not llm and not devset" $(ARGS)

# the quick loop: pytest's default markers skip slow, gpu and llm tests
test-fast: setup
	$(BIN)/python -m pytest -q -n 2 $(ARGS)

# the wheel, installed in a fresh venv, mines the sample: packaging holds everything it needs
wheel-test: setup
	rm -rf build/wheel-test && mkdir -p build/wheel-test
	$(BIN)/python -m pip wheel -q --no-deps -w build/wheel-test .
	$(PYTHON) -m venv build/wheel-test/venv
	build/wheel-test/venv/bin/python -m pip install -q "$(TORCH_SPEC)"
	build/wheel-test/venv/bin/python -m pip install -q build/wheel-test/kminer-*.whl
	cd build/wheel-test && venv/bin/kminer mine $(CURDIR)/examples/sample-repo --workdir run --llm none
	cd build/wheel-test && venv/bin/kminer stats --workdir run --json > stats.json
	build/wheel-test/venv/bin/python -c "import json, sys; s = json.load(open('build/wheel-test/stats.json')); \
	  ok = s['found'] == 6 and s['label_builds'] == 6 and 'testgen' in s; \
	  print('wheel-test:', s['found'], 'found,', s['label_builds'], 'labels build, testgen ran'); sys.exit(0 if ok else 1)"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: setup
	$(BIN)/ruff format .

clean:
	rm -rf runs build .pytest_cache .ruff_cache
