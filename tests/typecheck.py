"""Run mypy on the layers that must stay typed (``[tool.mypy]`` in ``pyproject.toml``).

setuptools maps four top-level folders into the ``dfit_mlir`` namespace (``package-dir``:
``dfit_mlir.passes`` is ``passes/``), which no type checker follows. This script lays the
namespace out as the installed package sees it — ``build/typecheck/dfit_mlir/`` holding
links to every entry of ``dfit_mlir/`` and to each mapped folder — and runs mypy there, so
``from dfit_mlir.passes import …`` resolves to the real files.

``python -m tests.typecheck [PACKAGE …]`` (default: the packages named by
``[tool.dfit.typecheck] packages``); ``make lint`` runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.import_layers import REPO, ROOT_MODULE, package_dirs


def namespace_root(repo: Path = REPO) -> Path:
    """``build/typecheck``, holding ``dfit_mlir`` as the installed package lays it out."""
    root = repo / "build" / "typecheck"
    package = root / ROOT_MODULE
    package.mkdir(parents=True, exist_ok=True)
    wanted: dict[str, Path] = {entry.name: entry for entry in (repo / ROOT_MODULE).iterdir()
                               if entry.name != "__pycache__"}
    for name, folder in package_dirs(repo).items():
        if name != ROOT_MODULE:
            wanted[name.removeprefix(ROOT_MODULE + ".")] = folder
    for link in package.iterdir():
        if link.is_symlink() and (link.name not in wanted or link.resolve() != wanted[link.name].resolve()):
            link.unlink()
    for name, target in wanted.items():
        link = package / name
        if not link.is_symlink():
            link.symlink_to(os.path.relpath(target, package))
    return root


def main(argv: list[str]) -> int:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = argv or config["tool"]["dfit"]["typecheck"]["packages"]
    root = namespace_root()
    command = [sys.executable, "-m", "mypy", "--config-file", str(REPO / "pyproject.toml")]
    for package in packages:
        command += ["-p", package]
    return subprocess.run(command, cwd=root, env={**os.environ, "MYPYPATH": str(root)}).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
