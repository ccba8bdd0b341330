"""Names of the places dfit reads and writes that several layers share: the cache
directory's environment variable and where a compile's manifest sits beside its vmfb.
It imports nothing of dfit's, so the file-writing layers (``atomic``, ``outputs``,
``manifest``) can all depend on it without depending on one another."""

from __future__ import annotations

from pathlib import Path

#: Overrides where dfit caches calibrations, its ledger of outputs and tracebacks.
CACHE_DIR_ENV = "DFIT_CACHE_DIR"


def manifest_path(vmfb: str | Path) -> Path:
    """``out/model.vmfb`` → ``out/model.manifest.json``."""
    vmfb = Path(vmfb)
    return vmfb.with_name(vmfb.stem + ".manifest.json")
