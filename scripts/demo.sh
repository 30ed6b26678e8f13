#!/usr/bin/env bash
# Showcase: every method on the real offline model, figures written under figures/.
set -euo pipefail
cd "$(dirname "$0")/.."
TL=".venv/bin/tlcap"
DATA="${TLCAP_DATA:-../shared/data}"
export HF_HUB_OFFLINE=1

echo "== knowledge neurons (Dai et al.) =="
$TL kn --model smollm2-135m --prompt "The capital of France is" --target " Paris" \
  --paraphrase "France's capital city is" --paraphrase "The capital city of France is" --out figures/kn
