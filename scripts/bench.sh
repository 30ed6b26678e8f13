#!/usr/bin/env bash
# Every benchmark, one after the other (do not run them in parallel: ratios are measured in one run).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
$PY benchmarks/bench_kn.py --threads 2 "$@"
$PY benchmarks/bench_trace.py "$@"
$PY benchmarks/bench_circuit.py "$@"
$PY benchmarks/bench_cnl.py --threads 2 --method ig --ns 10,20,40 --tag ig
$PY benchmarks/bench_cnl.py --threads 2 --method joint --ns 50,100,200
$PY benchmarks/bench_ql.py --quick
