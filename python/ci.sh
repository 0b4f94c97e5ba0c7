#!/usr/bin/env bash
# Builds the flashsel Python package (PyO3 extension, abi3 wheel for CPython
# 3.11+) and runs its tests on the CPU. Needs cargo and CPython >= 3.11 with
# pip; no GPU (the CUDA tests report themselves skipped without torch/CUDA).
#
#   bash python/ci.sh            # from the repository root (or anywhere)
#
# Environment: PYTHON (default python3.11, else python3) picks the interpreter
# for the venv python/.venv; FLASHSEL_PY_PROFILE=dev builds a debug extension
# (faster to compile, slower to run) instead of the release one.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"   # python/
start=$(date +%s)
say() { printf '[python/ci.sh +%ss] %s\n' "$(( $(date +%s) - start ))" "$*"; }

PY=${PYTHON:-}
if [[ -z "$PY" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then PY=python3.11; else PY=python3; fi
fi
"$PY" -c 'import sys; assert sys.version_info >= (3, 11), sys.version' \
    || { echo "python/ci.sh: need CPython >= 3.11 (got $("$PY" --version 2>&1))" >&2; exit 1; }

if [[ ! -x .venv/bin/python ]]; then
    say "creating python/.venv with $("$PY" --version 2>&1)"
    "$PY" -m venv .venv
fi
VPY="$PWD/.venv/bin/python"
say "installing pinned tools (requirements-ci.txt)"
"$VPY" -m pip install -q --disable-pip-version-check -r requirements-ci.txt

rm -rf dist
if [[ "${FLASHSEL_PY_PROFILE:-release}" == dev ]]; then
    say "building the wheel (debug)"
    .venv/bin/maturin build -o dist
else
    say "building the wheel (release)"
    .venv/bin/maturin build --release -o dist
fi
wheels=(dist/flashsel-*-cp311-abi3-*.whl)
[[ -f "${wheels[0]}" ]] || { echo "python/ci.sh: no cp311-abi3 wheel in dist/: $(ls dist)" >&2; exit 1; }
say "installing ${wheels[0]}"
"$VPY" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "${wheels[0]}"

# The installed wheel, not the source tree, is what the tests import.
(cd / && "$VPY" -c 'import flashsel, sys; print("flashsel", flashsel.__version__, "from", flashsel.__file__); print(flashsel.backends()["cuda"]["reason"] or "CUDA available")')

say "running pytest on python/tests"
"$VPY" -m pytest -p no:cacheprovider -q -rs tests
say "done"
