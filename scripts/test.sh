#!/usr/bin/env bash
# Run the test suite in the local environment (made on first use).
#   bash scripts/test.sh            default suite (no slow, no GPU tests), lint first
#   bash scripts/test.sh --slow     only the slow tests
#   bash scripts/test.sh ARGS...    extra pytest arguments (e.g. -k masks)
source "$(dirname "$0")/setup.sh"
ruff check src tests
lint-imports
# copies of six or more lines in the package (new ones fail here; see docs/ARCHITECTURE.md)
pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 --score=n src/attnlab
if [ "${1:-}" = "--slow" ]; then
  shift
  exec python -m pytest -m slow "$@"
fi
exec python -m pytest "$@"
