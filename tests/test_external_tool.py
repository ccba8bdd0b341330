"""The example plugin of ``examples/external_tool``, installed for real into a temporary
target directory and found by ``dfit tools`` and ``dfit analyze`` through its
``dfit.tools`` entry point.

Expected counts come from ``examples/models/convnet.mlir`` by hand: 2 convolutions,
2 matmuls, 3 ``linalg.generic`` (the ReLUs), 13 ``linalg.yield`` (one per region: 5 fills,
2 convolutions, 3 generics, the pooling, 2 matmuls); the bundle records 3 invocations of
its 6 dispatches.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import REPO

PLUGIN = REPO / "examples" / "external_tool"
EXPECTED_OPS = {"linalg.conv_2d_nhwc_hwcf": 2, "linalg.matmul": 2, "linalg.generic": 3, "linalg.yield": 13}
EXPECTED_EVENTS = {"dispatch": 6 * 3}


def can_build_wheels_here() -> bool:
    """setuptools 70.1+ has ``bdist_wheel`` built in; older ones need the ``wheel`` package."""
    try:
        major, minor = (int(part) for part in metadata.version("setuptools").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return False
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def pip_install(source: Path, target: Path) -> None:
    """``pip install --no-deps --target``: first with this environment's setuptools
    (``--no-build-isolation``: no download; setuptools < 70.1 also needs ``wheel``), else
    with pip's isolated build, which fetches setuptools from the configured index. Skips,
    saying why, when neither can build here."""
    base = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check", "--no-input",
            "--target", str(target), str(source)]
    failures = []
    for extra in ([["--no-build-isolation"]] if can_build_wheels_here() else []) + [[]]:
        done = subprocess.run([*base[:4], *extra, *base[4:]], capture_output=True, text=True, timeout=300)
        if done.returncode == 0:
            return
        failures.append((done.stdout + done.stderr).strip().splitlines()[-1])
        shutil.rmtree(target, ignore_errors=True)
    pytest.skip(f"cannot build the example plugin here: {' / '.join(failures)}")


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("external-tool")
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the repository.
    source = shutil.copytree(PLUGIN, root / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    pip_install(source, root / "site")
    return root / "site"


def dfit(plugin_path: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(plugin_path), os.environ.get("PYTHONPATH")])))
    # cwd outside the repository: its dfit_mlir/ folder must not shadow the installed package.
    return subprocess.run([sys.executable, "-m", "dfit_mlir", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)


def test_installed_plugin_is_listed_with_its_distribution(plugin_path: Path, tmp_path: Path) -> None:
    done = dfit(plugin_path, tmp_path, "tools")
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("op-histogram "))
    assert line.split()[1] == "dfit-example-tool"
    assert "Ops per kind and events per kind" in line


def test_plugin_runs_on_a_bundle(plugin_path: Path, iree_bundles: dict[str, Path], tmp_path: Path) -> None:
    done = dfit(plugin_path, tmp_path, "analyze", str(iree_bundles["full"]), "--tool", "op-histogram",
                "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "60 ops of 15 kinds" in done.stdout
    rows = list(csv.DictReader((tmp_path / "out" / "op-histogram" / "histogram.csv").read_text().splitlines()))
    ops = {row["kind"]: int(row["count"]) for row in rows if row["what"] == "op"}
    events = {row["kind"]: int(row["count"]) for row in rows if row["what"] == "event"}
    assert {kind: ops[kind] for kind in EXPECTED_OPS} == EXPECTED_OPS
    assert sum(ops.values()) == 60
    assert events["dispatch"] == EXPECTED_EVENTS["dispatch"]


def test_plugin_is_not_there_without_the_install(tmp_path: Path) -> None:
    done = dfit(tmp_path / "nothing", tmp_path, "analyze", str(tmp_path), "--tool", "op-histogram")
    assert done.returncode == 2 and "unknown tool 'op-histogram'" in done.stderr
