"""scripts/_venv.sh (sourced by demo.sh and test.sh): a failed install stops the script with a message
that gives the free disk space, the commonest cause on a shared machine, and leaves no install stamp
(so the next run installs again)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_a_failed_install_names_the_free_disk_and_stops(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "_venv.sh", tmp_path / "scripts")
    for name in ("setup.cfg", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path)
    fake_python = tmp_path / ".venv" / "bin" / "python"
    fake_python.parent.mkdir(parents=True)
    fake_python.write_text("#!/bin/sh\necho 'OSError: [Errno 28] No space left on device' >&2\nexit 1\n")
    fake_python.chmod(0o755)
    done = subprocess.run(["bash", "-c", "source scripts/_venv.sh && echo sourced"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "sourced" not in done.stdout
    assert "installing into" in done.stderr and "GB free on its disk" in done.stderr
    assert not (tmp_path / ".venv" / ".rlcap-install-stamp").exists()
