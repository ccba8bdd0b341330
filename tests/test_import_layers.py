"""The import layers hold (``tests/import_layers.py``), and the check fails where they
would not: an upward import planted at module level, inside a function, or relative."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import import_layers

REPO = import_layers.REPO


def test_the_tree_keeps_its_layers() -> None:
    assert [str(v) for v in import_layers.check()] == []


def test_every_module_is_in_a_layer() -> None:
    layers = [import_layers._Layer.parse(text) for text in import_layers.LAYERS]
    names = [name for name, _ in import_layers.modules(REPO) if name != import_layers.ROOT_MODULE]
    assert len(names) > 120
    assert [name for name in names if import_layers._place(name, layers) is None] == []


def test_ls_shows_the_layers() -> None:
    """``ls dfit_mlir``: sub-packages, and no loose module but ``__init__``/``__main__``."""
    loose = sorted(p.name for p in (REPO / "dfit_mlir").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py"]
    packages = {p.name for p in (REPO / "dfit_mlir").iterdir() if (p / "__init__.py").is_file()}
    assert {"core", "exporters", "analysis", "views", "fleet", "cli", "frontends"} <= packages


def _copy(tmp_path: Path) -> Path:
    """The package's source folders and pyproject.toml, enough for the check."""
    root = tmp_path / "repo"
    for name in ("dfit_mlir", "passes", "dialects", "adapters", "runtime_hooks"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    return root


PLANTED = [
    # (file, text appended, the upward import reported)
    ("dfit_mlir/core/ids.py", "\nfrom dfit_mlir.analysis import ledger  # planted\n",
     "dfit_mlir.core.ids imports dfit_mlir.analysis.ledger: dfit_mlir.analysis is above dfit_mlir.core"),
    ("passes/snapshot.py", "\n\ndef _planted():\n    from dfit_mlir.runtime_hooks import run  # noqa\n",
     "dfit_mlir.passes.snapshot imports dfit_mlir.runtime_hooks.run"),
    ("dfit_mlir/analysis/ledger.py", "\nfrom .tools import registry  # planted\n",
     "dfit_mlir.analysis.ledger imports dfit_mlir.analysis.tools.registry: dfit_mlir.analysis.tools is above "
     "dfit_mlir.analysis.ledger (dfit_mlir.analysis layers)"),
    ("dfit_mlir/exporters/traces.py", "\nimport dfit_mlir.views.html  # planted\n",
     "dfit_mlir.exporters.traces imports dfit_mlir.views.html"),
]


@pytest.mark.parametrize("path, text, expected", PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_upward_import_fails_the_check(tmp_path: Path, path: str, text: str, expected: str) -> None:
    root = _copy(tmp_path)
    with open(root / path, "a") as file:
        file.write(text)
    done = subprocess.run([sys.executable, "-m", "tests.import_layers", str(root)], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1, done.stdout
    assert expected in done.stdout
    assert done.stdout.strip().endswith("upward import(s); the layers are in tests/import_layers.py")


def test_the_untouched_copy_passes(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tests.import_layers", str(_copy(tmp_path))], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip() == f"import layers: kept ({len(import_layers.LAYERS)} layers)"
