"""The Model Explorer adapter class. Model Explorer imports ``<extension>.main`` for each
``--extensions=`` module; defining an ``Adapter`` subclass registers it."""

from __future__ import annotations

from typing import Any

from model_explorer import Adapter, AdapterMetadata

from dfit_mlir.views import explorer_adapter


class DfitSemanticModelAdapter(Adapter):
    """A dfit manifest or bundle → Model Explorer graph of its source ops."""

    metadata = AdapterMetadata(
        id=explorer_adapter.ADAPTER_ID, name="dfit semantic model",
        description="dfit manifests and bundles: source ops by module path, tensors as edges, "
                    "the ledger's time, FLOPs, MACs, bytes, phase and dispatch per op.",
        fileExts=["json"])

    def __init__(self) -> None:
        super().__init__()

    def convert(self, model_path: str, settings: dict[str, Any]) -> dict[str, Any]:
        return {"graphs": [explorer_adapter.build_graph(explorer_adapter.open_model(model_path))]}
