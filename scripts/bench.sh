#!/usr/bin/env bash
# Run attnlab's main job, the benchmark, in the local environment (made on first use).
#   bash scripts/bench.sh                 quick profile, report in bench-out/
#   bash scripts/bench.sh kernels         one suite;  bash scripts/bench.sh --profile full
source "$(dirname "$0")/setup.sh"
exec attnlab bench "$@"
