"""The code is clean under ruff as configured in pyproject.toml (line length 120; pycodestyle's import, statement
and syntax errors and long lines; pyflakes' whole set), so the suite, and with it CI, fails on a finding.

A planted finding (an unused import, a line of 121 characters) must be reported, so a configuration that checks
nothing would fail here too.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _ruff(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert exe, "ruff is one of the test requirements (requirements-test.txt)"
    return subprocess.run([exe, "check", "--no-cache", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_ruff_finds_nothing():
    done = _ruff("specviz", "tests", "scripts", "app.py")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_reports_planted_findings(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "planted.py").write_text("import os\n\nx = '" + "a" * 115 + "'\n", encoding="utf-8")
    done = _ruff("planted.py", cwd=tmp_path)
    assert done.returncode == 1 and "F401" in done.stdout and "E501" in done.stdout, done.stdout + done.stderr
