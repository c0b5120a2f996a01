"""The package installs from a clone and runs README's Python snippet from any directory.

The install goes into a fresh virtual environment whose dependencies come from the test's own
environment (a .pth file), so nothing is downloaded: ``pip install --no-deps --no-build-isolation``
checks what this repository's pyproject builds, not what PyPI serves.
"""

from __future__ import annotations

import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


def readme_snippet() -> str:
    """README's Python API block, run as written but with 16 new tokens."""
    block = re.search(r"## Python API\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    lines = [line for line in block.splitlines() if not line.startswith(("trace.", "baseline ="))]
    return (
        "\n".join(lines).replace("max_new_tokens=64", "max_new_tokens=16")
        + "\nprint('OUTPUT', trace.output_ids, trace.alpha)\n"
    )


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    (site / "parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = root / "bin" / "python"
    out = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return root


def test_installed_package_runs_the_readme_snippet_outside_the_repository(venv, tmp_path):
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", readme_snippet()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OUTPUT [" in out.stdout
    # the package and the embedded pair come from the installation, not from this clone
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import specviz, specviz.assets; print(specviz.__file__); print(specviz.assets.ASSETS)",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.splitlines()
    assert all(str(venv) in line for line in where), where


def test_a_target_install_finds_its_assets_as_package_data(tmp_path):
    """``pip install --target`` (like ``--user``) puts no files under sys.prefix: the embedded pair,
    the prompt sets and the recordings travel inside the package and are found there."""
    target = tmp_path / "lib"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    check = (
        "import specviz.assets as a, json; print(a.ASSETS); "
        "print(sorted(p.name for p in (a.ASSETS / 'models').iterdir())); "
        "print(len(json.loads((a.ASSETS / 'prompts_grounded.json').read_text())) > 0, "
        "len(list((a.ASSETS / 'recordings').glob('*.json'))) > 0)"
    )
    run = subprocess.run(
        [sys.executable, "-c", check],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"},
    )
    assert run.returncode == 0, run.stderr[-3000:]
    where, models, found = run.stdout.splitlines()
    assert (
        where == str(target / "specviz" / "data")
        and models == "['README.md', 'drafter', 'smollm2-drafter', 'smollm2-eagle', 'target']"
        and found == "True True"
    )
    assert not (target / "share").exists() and not (target / "specviz" / "data" / "screenshot.png").exists()


def test_console_command_and_declared_dependencies(venv, tmp_path):
    out = subprocess.run(
        [
            str(venv / "bin" / "specviz"),
            "generate",
            "--pair",
            "embedded",
            "--prompt",
            "import os",
            "--max-new-tokens",
            "4",
            "--json",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert '"output_ids"' in out.stdout
    metadata = next((venv / "lib").glob("python3*/site-packages/specviz-*.dist-info/METADATA")).read_text()
    required = {m.group(1).lower() for m in re.finditer(r"^Requires-Dist: ([A-Za-z0-9_.-]+)", metadata, re.M)}
    pinned = {
        line.split("==")[0].strip().lower()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    assert pinned <= required, pinned - required


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_module_the_package_imports_comes_with_requirements_txt():
    """README's demo command installs requirements.txt only: every third-party module that specviz
    imports at module level must be pinned there or be a (non-optional) dependency of a pinned one.
    (The exactness lab's scipy once sat in requirements-test.txt only, and `python app.py` failed.)"""
    import ast
    from importlib import metadata

    from packaging.requirements import Requirement

    imported = set()
    for path in (ROOT / "specviz").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module and not node.level
                else []
            )
            imported |= {n.split(".")[0] for n in names}
    imported -= set(sys.stdlib_module_names) | {"specviz"}
    dists = metadata.packages_distributions()
    wanted = {_norm(dists[m][0]) for m in imported}
    installed = {
        _norm(line.split("==")[0])
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    todo = list(installed)
    while todo:
        for text in metadata.requires(todo.pop()) or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # optional, or for another platform
            name = _norm(req.name)
            if name not in installed:
                installed.add(name)
                todo.append(name)
    assert wanted <= installed, (
        f"imported by specviz but not installed by requirements.txt: {sorted(wanted - installed)}"
    )
