#!/usr/bin/env bash
# Run the test suite in the local environment (made on first use).
#   bash scripts/test.sh            default suite (no slow, no GPU tests), lint first
#   bash scripts/test.sh --slow     only the slow tests
#   bash scripts/test.sh ARGS...    extra pytest arguments (e.g. -k masks)
# The default suite runs on every core (pytest-xdist, one worker per core, at most 4); the tests
# that assert on wall-clock time (marked serial) run alone afterwards, so no other test loads the
# machine beside them.
source "$(dirname "$0")/setup.sh"
# the native kernel is compiled once per machine (cached); compile it beside the lint, on the other
# core, so no test worker waits for it (a failed build is recorded, and its tests say so)
python -c "from attnlab.exact import native_build; native_build.build()" >/dev/null 2>&1 &
NATIVE_BUILD=$!
ruff check src tests
lint-imports
# copies of six or more lines in the package (new ones fail here; see docs/ARCHITECTURE.md)
pylint --disable=all --enable=duplicate-code --min-similarity-lines=6 --score=n src/attnlab
wait "$NATIVE_BUILD" || true
if [ "${1:-}" = "--slow" ]; then
  shift
  exec python -m pytest -m slow "$@"
fi
WORKERS="${ATTNLAB_TEST_WORKERS:-$(python -c 'import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))')}"
DEFAULT="not slow and not gpu and not docs"
status=0
python -m pytest -n "$WORKERS" --dist loadgroup --durations=25 -m "$DEFAULT and not serial" "$@" || status=$?
# exit 5 = nothing selected (e.g. -k matched only one part): not a failure of the other part
[ "$status" -eq 5 ] && status=0
# with no arguments, only the files that hold serial tests are collected again
if [ "$#" -eq 0 ]; then set -- $(grep -rl --include='test_*.py' 'mark.serial' tests | sort); fi
python -m pytest -p no:xdist -m "$DEFAULT and serial" "$@" || { s=$?; [ "$s" -eq 5 ] || status=$s; }
exit "$status"
