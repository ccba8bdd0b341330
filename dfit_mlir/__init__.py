"""dfit-mlir: stable semantic IDs, lineage and manifests for ML compilers."""

__version__ = "0.1.0"
