#!/usr/bin/env bash
# Build the documentation site into docs/_build/html, warnings as errors, in the local
# environment (made on first use, with the docs extra). The tour's pages are executed.
#   bash scripts/docs.sh             build (a page that raises or any warning fails it)
#   bash scripts/docs.sh --test      build, then the docs tests (links, API coverage, browser)


source "$(dirname "$0")/setup.sh"
START=$(date +%s)
python -m sphinx -W --keep-going -q -b html -d docs/_build/doctrees docs docs/_build/html
echo "docs built in $(( $(date +%s) - START )) s: docs/_build/html/index.html"
if [ "${1:-}" = "--test" ]; then
  shift
  exec python -m pytest -m docs tests/docs "$@"
fi
