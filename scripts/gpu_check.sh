#!/usr/bin/env bash
# One prepared GPU check, within 10 minutes: the GPU test suite and a quick kernel benchmark.
#   bash scripts/gpu_check.sh            report in $OUT (if set) else ./gpu-check-out
#
# Uses the Python that already has a CUDA build of torch ($PYTHON, else .venv/bin/python
# when that torch sees CUDA, else python3) and never installs, upgrades or removes torch:
# attnlab runs from src/ via PYTHONPATH; a missing pure-Python dependency is installed with
# --no-deps; flash-attn only from a prebuilt wheel (--only-binary, --no-deps, or the wheel
# file named by $FLASH_ATTN_WHEEL) and only kept if it then imports. Every stage has its own
# time limit (GPU_CHECK_BUDGET seconds in all, default 570) so the script always finishes
# and writes report.md: GPU name, versions, flash-attn status, test pass/fail/skip counts
# with the failures named, and the benchmark summary.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEST="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$DEST"
BUDGET="${GPU_CHECK_BUDGET:-570}"
START=$(date +%s)
left() { echo $(( BUDGET - ($(date +%s) - START) )); }
log() { echo "[gpu_check $(( $(date +%s) - START ))s] $*" | tee -a "$DEST/steps.log"; }
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

cuda_python() { "$1" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; }
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ] && cuda_python .venv/bin/python; then PY=.venv/bin/python; else PY=python3; fi
fi
log "python: $PY"
"$PY" - > "$DEST/env.txt" 2>&1 <<'EOF'
import platform, torch
print("python", platform.python_version())
print("torch", torch.__version__, "cuda", torch.version.cuda)
print("cuda available", torch.cuda.is_available())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(f"gpu {i}: {p.name}, capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB")
EOF
cat "$DEST/env.txt"

# pure-Python dependencies that may be missing; --no-deps: nothing can pull another torch
pip_quiet() { timeout 60 "$PY" -m pip install -q --disable-pip-version-check --no-deps "$@" >> "$DEST/pip.log" 2>&1; }
for spec in "numpy:numpy" "safetensors:safetensors" "pytest:pytest" "iniconfig:iniconfig" "pluggy:pluggy" "packaging:packaging"; do
  mod="${spec%%:*}"; pkg="${spec##*:}"
  if ! "$PY" -c "import $mod" 2>/dev/null; then
    log "installing $pkg (--no-deps)"
    pip_quiet "$pkg" || log "could not install $pkg (see pip.log)"
  fi
done

# flash-attn: a prebuilt wheel or nothing; kept only if it imports against this torch
FLASH="not installed"
if "$PY" -c "import flash_attn" 2>/dev/null; then
  FLASH="present: $("$PY" -c 'import flash_attn; print(flash_attn.__version__)')"
else
  log "trying a prebuilt flash-attn wheel (--only-binary, --no-deps)"
  if [ -n "${FLASH_ATTN_WHEEL:-}" ]; then
    timeout 90 "$PY" -m pip install -q --disable-pip-version-check --no-deps "$FLASH_ATTN_WHEEL" >> "$DEST/pip.log" 2>&1
  else
    timeout 90 "$PY" -m pip install -q --disable-pip-version-check --no-deps --only-binary=:all: flash-attn \
      >> "$DEST/pip.log" 2>&1
  fi
  if "$PY" -c "import flash_attn" >> "$DEST/pip.log" 2>&1; then
    FLASH="installed: $("$PY" -c 'import flash_attn; print(flash_attn.__version__)')"
  else
    "$PY" -m pip uninstall -y -q flash-attn >> "$DEST/pip.log" 2>&1 || true
    FLASH="not available (no wheel matching this torch/CUDA; see pip.log)"
  fi
fi
log "flash-attn: $FLASH"

# the GPU test suite: SIGINT first so pytest still writes its summary and junit file
T_TESTS=$(( $(left) - 200 )); [ "$T_TESTS" -gt 330 ] && T_TESTS=330
log "pytest -m gpu (limit ${T_TESTS}s)"
timeout -s INT -k 20 "$T_TESTS" "$PY" -m pytest -m gpu tests/test_gpu.py -vv -rfEs -p no:cacheprovider \
  --junitxml="$DEST/gpu-tests.xml" > "$DEST/pytest.log" 2>&1
TEST_RC=$?
log "pytest exit $TEST_RC"

# the kernels benchmark, quick profile, with what time is left
T_BENCH=$(( $(left) - 20 ))
log "attnlab bench kernels --device cuda --profile quick (limit ${T_BENCH}s)"
timeout -s INT -k 15 "$T_BENCH" "$PY" -m attnlab.cli bench kernels --device cuda --profile quick --quiet \
  --out "$DEST/bench" > "$DEST/bench.log" 2>&1
BENCH_RC=$?
log "bench exit $BENCH_RC"

"$PY" - "$DEST" "$TEST_RC" "$BENCH_RC" "$FLASH" > "$DEST/report.md" <<'EOF'
import re, sys
from pathlib import Path

dest, test_rc, bench_rc, flash = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
log = (dest / "pytest.log").read_text(errors="replace") if (dest / "pytest.log").exists() else ""
counts = {k: len(re.findall(rf"^tests/\S+ {k}\b", log, re.M)) for k in ("PASSED", "FAILED", "SKIPPED", "ERROR")}
failed = re.findall(r"^(tests/\S+) (?:FAILED|ERROR)\b", log, re.M)
print("# GPU check\n")
print("```\n" + (dest / "env.txt").read_text(errors="replace").strip() + "\n```\n")
print(f"- flash-attn: {flash}")
print(f"- pytest -m gpu: exit {test_rc} ({'124: timed out' if test_rc in ('124', '130') else 'finished'}); "
      + ", ".join(f"{v} {k.lower()}" for k, v in counts.items()))
for name in failed[:30]:
    print(f"  - failed: {name}")
skips = sorted(set(re.findall(r"^SKIPPED \[\d+\] (.+)$", log, re.M)))
for s in skips[:15]:
    print(f"  - skipped: {s}")
print(f"- bench kernels (quick, cuda): exit {bench_rc}\n")
md = dest / "bench" / "report.md"
text = md.read_text(errors="replace") if md.exists() else (dest / "bench.log").read_text(errors="replace")
lines = text.strip().splitlines()
print("```\n" + "\n".join(lines[:60]) + ("\n..." if len(lines) > 60 else "") + "\n```")
EOF
cat "$DEST/report.md"
log "done in $(( $(date +%s) - START ))s; report: $DEST/report.md"
