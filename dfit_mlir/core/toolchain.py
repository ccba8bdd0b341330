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
    ``iree-run-module``, ``iree-profile``): the environment's scripts folder first, so
    the pinned copy wins over anything else on PATH."""
    import shutil
    import sys
    from pathlib import Path

    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise ToolchainError(f"{name} not found; install iree-base-runtime=={PINNED['iree-base-runtime']}")
    return found
