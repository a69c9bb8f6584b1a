#!/usr/bin/env bash
# The test command: sets up .venv when needed, then runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -k world -x`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
python -m pytest -q "$@"
