#!/usr/bin/env bash
# Packaging check (run by .ci/run): python -m build makes an sdist and a wheel; the wheel
# installs into a fresh virtual environment with torch pinned first (torch==2.13.0, so no
# step can pull another torch), and `attnlab --version` and `attnlab info` run from it.
#   bash scripts/package_check.sh          uses .venv's python for the build ($PYTHON overrides)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-.venv/bin/python}"
TORCH_PIN="torch==2.13.0"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/attnlab-package.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
START=$(date +%s)
VERSION="$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"

"$PY" -m build --outdir "$WORK/dist" . > "$WORK/build.log" 2>&1 || { cat "$WORK/build.log"; exit 1; }
SDIST="$WORK/dist/attnlab-$VERSION.tar.gz"
WHEEL="$(ls "$WORK"/dist/attnlab-"$VERSION"-*.whl)"
[ -f "$SDIST" ] || { echo "package_check: no sdist $SDIST" >&2; exit 1; }
# the sdist carries what pip needs to rebuild and what a reader needs; the wheel only the package
tar -tzf "$SDIST" > "$WORK/sdist.txt"  # (a file, not a pipe: grep -q would cut tar off under pipefail)
grep -qx "attnlab-$VERSION/README.md" "$WORK/sdist.txt"
grep -qx "attnlab-$VERSION/src/attnlab/__init__.py" "$WORK/sdist.txt"
"$PY" - "$WHEEL" <<'PYEOF'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert "attnlab/__init__.py" in names and "attnlab/cli.py" in names, names[:20]
assert "attnlab/exact/native_attn.cpp" in names, "the native kernel's source (compiled on first use) is not in the wheel"
stray = [n for n in names if n.split("/")[0] in ("tests", "docs", "scripts")]
assert not stray, stray
entry = [n for n in names if n.endswith("entry_points.txt")]
assert entry and b"attnlab = attnlab.cli:main" in zipfile.ZipFile(sys.argv[1]).read(entry[0]), entry
PYEOF

"$PY" -m venv "$WORK/venv"
VPY="$WORK/venv/bin/python"
"$VPY" -m pip install -q --disable-pip-version-check "$TORCH_PIN"
echo "$TORCH_PIN" > "$WORK/pin.txt"
"$VPY" -m pip install -q --disable-pip-version-check -c "$WORK/pin.txt" "$WHEEL"
"$VPY" -c "import torch; assert torch.__version__.split('+')[0] == '2.13.0', torch.__version__"

cd "$WORK"  # away from src/, so the installed wheel is what runs
GOT="$("$WORK/venv/bin/attnlab" --version)"
[ "$GOT" = "attnlab $VERSION" ] || { echo "package_check: attnlab --version says '$GOT', want 'attnlab $VERSION'" >&2; exit 1; }
"$WORK/venv/bin/attnlab" info > "$WORK/info.txt"
grep -q "^attnlab $VERSION" "$WORK/info.txt"
"$VPY" -c "import attnlab, sys; assert attnlab.__file__.startswith('$WORK'), attnlab.__file__"
echo "package_check: sdist + wheel of attnlab $VERSION built, the wheel installed beside $TORCH_PIN in a fresh venv," \
     "attnlab --version and attnlab info ran from it ($(( $(date +%s) - START )) s)"
