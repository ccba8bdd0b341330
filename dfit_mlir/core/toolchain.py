"""The pinned toolchain and the gates in front of private IREE entry points."""

from __future__ import annotations

from importlib import metadata

from dfit_mlir.core.errors import ToolchainError

PINNED = {"iree-base-compiler": "3.13.0", "iree-base-runtime": "3.13.0", "xdsl": "0.74.0"}

#: IREE's compiler phases, in pipeline order (``iree-compile --compile-to=<phase>``).
IREE_PHASES = (
    "input",
    "abi",
    "preprocessing",
    "global-optimization",
    "dispatch-creation",
    "flow",
    "stream",
    "executable-sources",
    "executable-configurations",
    "executable-targets",
    "hal",
    "vm",
)


def installed_version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {package: installed_version(package) for package in PINNED}


def require_pinned(package: str, purpose: str) -> None:
    """Refuse to use ``package`` for ``purpose`` unless it is the pinned version."""
    found = installed_version(package)
    wanted = PINNED[package]
    if found != wanted:
        raise ToolchainError(
            f"{purpose} needs {package}=={wanted} (found {found or 'none'}); "
            f"install it with: pip install {package}=={wanted}"
        )


def runtime_tool(name: str) -> str:
    """Path of a command-line tool shipped by iree-base-runtime (``iree-dump-module``,
    ``iree-run-module``, ``iree-profile``): the binary in the installed runtime's
    libraries folder (:func:`_runtime_binary`), else the environment's scripts folder,
    so the pinned copy wins over anything else on PATH, else PATH."""
    import shutil
    import sys
    from pathlib import Path

    binary = _runtime_binary(name)
    if binary is not None:
        return binary
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise ToolchainError(f"{name} not found; install iree-base-runtime=={PINNED['iree-base-runtime']}")
    return found


def _runtime_binary(name: str) -> str | None:
    """The tool's binary inside ``iree._runtime_libs`` (``iree._runtime_libs_tracy`` under
    ``IREE_PY_RUNTIME=tracy``, as IREE's own trampoline picks), found without importing
    it. The console script of the same name is a Python trampoline that runs the binary
    as its child: a SIGTERM to dfit killed the trampoline and left the binary running,
    reparented, for as long as the run would have lasted."""
    import importlib.util
    import os
    from pathlib import Path

    package = "iree._runtime_libs_tracy" if os.environ.get("IREE_PY_RUNTIME") == "tracy" else "iree._runtime_libs"
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None
