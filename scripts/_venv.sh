# Sourced by demo.sh and test.sh: make sure .venv exists and holds this checkout's package.
# Idempotent: the install step is skipped while setup.cfg and pyproject.toml are unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
STAMP="$VENV/.rlcap-install-stamp"

if [ ! -x "$PY" ]; then
  echo "[rlcap] creating $VENV"
  python3 -m venv "$VENV"
fi
wanted="$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$wanted" ]; then
  echo "[rlcap] installing rlcap and its dependencies into $VENV (first run takes a few minutes)"
  # torch/torchvision pins come from this machine's disk through the pip constraint file.
  if ! "$PY" -m pip install --disable-pip-version-check -q -e "$ROOT[dev]"; then
    # the commonest cause on a shared machine is a full disk, which pip names only deep in its traceback
    free_gb="$(df -Pk "$VENV" | awk 'NR == 2 {printf "%.1f", $4 / 1048576}')"
    echo "[rlcap] installing into $VENV failed (pip's message above); $free_gb GB free on its disk," \
         "and the environment takes about 6.5 GB with torch" >&2
    exit 1
  fi
  echo "$wanted" > "$STAMP"
else
  echo "[rlcap] $VENV is up to date"
fi
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
