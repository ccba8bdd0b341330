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
