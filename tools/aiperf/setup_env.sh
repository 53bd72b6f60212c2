#!/usr/bin/env bash
# Build .venv-aiperf at the repository root: AIPerf 0.13.0 plus the telefuser-aiperf plugin (editable), kept apart
# from the engine's .venv (AIPerf pins pillow/pandas/rich/pyzmq and pulls transformers 5.x; it never needs torch).
# Idempotent: a second run only re-checks. Environment: PYTHON (default python3, must be 3.11..3.13),
# AIPERF_VENV (default <repo>/.venv-aiperf), AIPERF_WHEEL (optional local aiperf-0.13.0 wheel instead of PyPI).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
VENV="${AIPERF_VENV:-$ROOT/.venv-aiperf}"
AIPERF_VERSION="0.13.0"
PLUGIN_DIR="$ROOT/tools/aiperf"
STAMP="$VENV/.telefuser-aiperf-installed"

"$PYTHON" - <<'PY'
import sys
if not ((3, 11) <= sys.version_info[:2] < (3, 14)):
    sys.exit(f"AIPerf 0.13.0 needs Python 3.11..3.13; {sys.executable} is {sys.version.split()[0]}")
PY

if [ ! -x "$VENV/bin/python" ]; then
  echo "== creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi

want="aiperf==$AIPERF_VERSION plugin=$(sha256sum "$PLUGIN_DIR/pyproject.toml" | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && "$VENV/bin/aiperf" --version >/dev/null 2>&1; then
  echo "== $VENV is up to date ($want)"
else
  echo "== installing aiperf==$AIPERF_VERSION and telefuser-aiperf (editable) into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  src="aiperf==$AIPERF_VERSION"
  if [ -n "${AIPERF_WHEEL:-}" ]; then src="$AIPERF_WHEEL"; fi
  "$VENV/bin/python" -m pip install -q "$src"
  "$VENV/bin/python" -m pip install -q --no-deps -e "$PLUGIN_DIR"
  echo "$want" > "$STAMP"
fi

"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
import importlib.util
import sys

if importlib.util.find_spec("torch") is not None:
    sys.exit("error: torch is installed in the AIPerf venv; it must stay torch-free")
aiperf = md.version("aiperf")
if aiperf != "0.13.0":
    sys.exit(f"error: aiperf {aiperf} installed, 0.13.0 expected")
print(f"python {sys.version.split()[0]}  aiperf {aiperf}  telefuser-aiperf {md.version('telefuser-aiperf')}"
      f"  transformers {md.version('transformers')}  tokenizers {md.version('tokenizers')}")
PY
"$VENV/bin/aiperf" plugins --validate >/dev/null
listing="$("$VENV/bin/aiperf" plugins 2>&1)"
if ! grep -q "telefuser-aiperf" <<<"$listing" || grep -q "failed" <<<"$listing"; then
  echo "$listing" >&2
  echo "error: the telefuser-aiperf plugin is not registered with AIPerf" >&2
  exit 1
fi
echo "== AIPerf plugins valid; telefuser-aiperf provides endpoint + transport telefuser_stream"
