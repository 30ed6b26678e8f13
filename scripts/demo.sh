#!/usr/bin/env bash
# Showcase: every method on the real offline model (SmolLM2-135M), figures under figures/.
# About 10 minutes on a 2-core CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
TL=".venv/bin/tlcap"
DATA="${TLCAP_DATA:-../shared/data}"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "== knowledge neurons (Dai et al.) =="
$TL kn --model smollm2-135m --prompt "The capital of France is" --target " Paris" \
  --paraphrase "France's capital city is" --paraphrase "The capital city of France is" --out figures/kn

echo "== causal tracing (ROME) =="
$TL trace --model smollm2-135m --prompt "The Eiffel Tower is located in the city of" \
  --subject "The Eiffel Tower" --target " Paris" --out figures/trace

echo "== ROME edit =="
$TL edit --model smollm2-135m --prompt "The Eiffel Tower is located in the city of" \
  --subject "The Eiffel Tower" --target-new " Rome" --layer 4 --out figures/edit

echo "== knowledge circuit (EAP-IG) =="
$TL circuit --model smollm2-135m --prompt "The capital of France is" --target " Paris" \
  --corrupt-prompt "The capital of Italy is" --top-n 300 --out figures/circuit

if [ -d "$DATA" ]; then
  echo "== CNL: Emotion capability neurons, erase =="
  $TL cnl locate --model smollm2-135m --dataset emotion --data-dir "$DATA" --n 24 --sigma 3 \
    --method joint --out figures/cnl_emotion
  $TL cnl erase --model smollm2-135m --dataset emotion --data-dir "$DATA" \
    --neurons figures/cnl_emotion/summary.json --n 40 --out figures/cnl_emotion_erase

  echo "== Query Localization: consistency and knowledge synapses =="
  $TL ql consistency --model smollm2-135m --data-dir "$DATA" --relations P103,P37 --n-facts 4 \
    --method ig --steps 10 --max-queries 3 --out figures/ql_consistency
  $TL ql synapses --model smollm2-135m --data-dir "$DATA" --relations P103 --n-facts 2 \
    --steps 10 --max-queries 3 --out figures/ql_synapses
else
  echo "(no data folder at $DATA: set TLCAP_DATA to run the CNL and QL parts)"
fi
echo "figures written under figures/"
