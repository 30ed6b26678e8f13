#!/usr/bin/env bash
# Run the unit tests against TransformerLens 3.9 (HookedTransformer) in a separate venv.
#
# Usage: tests/run_tl39.sh [pytest args...]   (default: tests/unit -q)
# `make test` runs `tests/run_tl39.sh -m tl39 tests/unit -q`: the tests marked tl39, which the
# main run deselects. The marker filter of pyproject.toml (-m "not tl39") is lifted here; a -m
# given as an argument wins.
# Creates .venv39 on first use: torch is installed first, pinned, so TL 3.9 does not pull
# another torch build; then transformer-lens 3.9.x (needs transformers>=5.9) and tlcap editable
# with its test extra (pytest, jaxtyping and beartype pinned as in constraints.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${TLCAP_VENV39:-.venv39}
TORCH_VERSION=${TLCAP_TORCH_VERSION:-2.13.0}
PINS=$(grep -E '^(pytest|jaxtyping|beartype)==' constraints.txt | tr '\n' ' ')
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import transformer_lens, tlcap, beartype" 2>/dev/null; then
    echo "[run_tl39] setting up $VENV (torch==$TORCH_VERSION, transformer-lens>=3.9,<4)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION"
    "$VENV/bin/pip" install -q "transformer-lens>=3.9,<4" "transformers>=5.9,<6"
    # shellcheck disable=SC2086
    "$VENV/bin/pip" install -q -e ".[test]" "torch==$TORCH_VERSION" "transformer-lens>=3.9,<4" $PINS
fi
"$VENV/bin/python" - <<'PY' >&2 || true
from importlib.metadata import version
print("[run_tl39] " + ", ".join(f"{p} {version(p)}" for p in ("torch", "transformer-lens", "transformers")))
PY
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ $# -eq 0 ]; then
    set -- tests/unit -q
fi
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -m "tl39 or not tl39" "$@"
