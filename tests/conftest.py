"""Shared helpers for the tests: tagging text with the MLIR engine, paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from iree.compiler import ir

from dfit_mlir.passes import mlir_engine

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "models"
CONVNET = EXAMPLES / "convnet.mlir"


def tag_text(text: str) -> dict[str, str]:
    """{id: structural hash} of every op of ``text``, tagged by the MLIR engine in a
    fresh context that is gone when this returns."""
    context = ir.Context()
    context.allow_unregistered_dialects = True
    with context:
        module = ir.Module.parse(text)
        tagged = {item.id: item.hash for item in mlir_engine.tag_module(module.operation)}
    del module
    return tagged


@pytest.fixture(scope="session")
def convnet_text() -> str:
    return CONVNET.read_text()


#: Real vendor artifacts (``../shared/fixtures/<backend>/...``, listed in its SOURCES.md).
VENDOR_FIXTURES = REPO.parent / "shared" / "fixtures"


def vendor_fixture(relative: str) -> Path:
    """``../shared/fixtures/<relative>``; skips the test, saying why, when ``../shared``
    (present in CI, absent in a user's own checkout) or the file is not there."""
    if not VENDOR_FIXTURES.is_dir():
        pytest.skip(f"{VENDOR_FIXTURES} is absent (the repository's ../shared holds the real vendor artifacts)")
    path = VENDOR_FIXTURES / relative
    if not path.exists():
        pytest.skip(f"vendor fixture {path} is missing")
    return path
