"""The ground floor: what every other layer of dfit-mlir stands on.

Stable IDs (``ids``), locations and lineage, the manifest and its schema, the normalized
event schema and the pipeline that fills it (``event_schema``, ``event_pipeline``,
``filters``), the cost rules (``costs``, ``site_costs``), the exit-status contract
(``errors``), output safety (``atomic``, ``outputs``, ``paths``) and the toolchain facts.
Nothing here imports from another layer (``tests/test_import_layers.py``).
"""
