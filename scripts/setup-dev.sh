#!/usr/bin/env bash
# Create .venv (if missing) and install nbdist editable with its test extras, pinned by
# constraints/dev.txt. Safe to run again: an existing .venv is reused and brought up to date.
set -euo pipefail

cd "$(dirname "$0")/.."

if [[ ! -x .venv/bin/python ]]; then
    if command -v python3.11 >/dev/null 2>&1; then
        PY=python3.11
    elif command -v python3 >/dev/null 2>&1; then
        PY=python3
    else
        echo "setup-dev: no python3.11 or python3 on PATH" >&2
        exit 1
    fi
    echo "setup-dev: creating .venv with $($PY --version 2>&1)"
    if ! "$PY" -m venv .venv; then
        rm -rf .venv
        echo "setup-dev: '$PY -m venv' failed; on Debian/Ubuntu: apt-get install python3-venv" >&2
        exit 1
    fi
fi

# -q twice hides progress and 'already satisfied' lines; errors still print.
.venv/bin/python -m pip install -q -q --upgrade pip
.venv/bin/python -m pip install -q -q -c constraints/dev.txt -e '.[test]'

echo "setup-dev: ready ($(.venv/bin/python -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}")'))"
