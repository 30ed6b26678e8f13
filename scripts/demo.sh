#!/usr/bin/env bash
# Showcase: every method on the real offline model (SmolLM2-135M), figures under figures/.
# About 10 minutes on a 2-core CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
TL=".venv/bin/tlcap"
# Data: the copies bundled with tlcap; a folder of full datasets when the user set TLCAP_DATA
# (the ${a[@]+...} form keeps bash 3.2 happy with an empty array under set -u).
DATA_ARGS=()
if [ -n "${TLCAP_DATA:-}" ]; then DATA_ARGS=(--data-dir "$TLCAP_DATA"); fi
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

echo "== knowledge neurons (Dai et al.) =="
$TL kn --model smollm2-135m --prompt "The capital of France is" --target " Paris" \
  --paraphrase "France's capital city is" --paraphrase "The capital city of France is" --out figures/kn --overwrite

echo "== causal tracing (ROME) =="
$TL trace --model smollm2-135m --prompt "The Eiffel Tower is located in the city of" \
  --subject "The Eiffel Tower" --target " Paris" --out figures/trace --overwrite

echo "== ROME edit =="
$TL edit --model smollm2-135m --prompt "The Eiffel Tower is located in the city of" \
  --subject "The Eiffel Tower" --target-new " Rome" --layer 4 --out figures/edit --overwrite

echo "== knowledge circuit (EAP-IG) =="
$TL circuit --model smollm2-135m --prompt "The capital of France is" --target " Paris" \
  --corrupt-prompt "The capital of Italy is" --top-n 300 --out figures/circuit --overwrite

echo "== CNL: Emotion capability neurons, erase =="
$TL cnl locate --model smollm2-135m --dataset emotion ${DATA_ARGS[@]+"${DATA_ARGS[@]}"} --n 24 --sigma 3 \
  --method joint --no-resume --out figures/cnl_emotion --overwrite
$TL cnl erase --model smollm2-135m --dataset emotion ${DATA_ARGS[@]+"${DATA_ARGS[@]}"} \
  --neurons figures/cnl_emotion/summary.json --n 40 --out figures/cnl_emotion_erase --overwrite

echo "== Query Localization: consistency and knowledge synapses =="
$TL ql consistency --model smollm2-135m ${DATA_ARGS[@]+"${DATA_ARGS[@]}"} --relations P103,P37 --n-facts 4 \
  --method ig --steps 10 --max-queries 3 --out figures/ql_consistency --overwrite
# P37 first: fact 0 (the heatmap's) then has three known queries and is in K_I; the other three have two (excluded)
$TL ql synapses --model smollm2-135m ${DATA_ARGS[@]+"${DATA_ARGS[@]}"} --relations P37,P103 --n-facts 4 \
  --steps 10 --max-queries 3 --out figures/ql_synapses --overwrite
echo "figures written under figures/"
