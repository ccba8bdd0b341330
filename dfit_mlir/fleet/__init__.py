"""Many bundles at once: the store (``store``), merging ranks into one job (``merge``,
``placement``) and comparing two runs (``diff``). Reads bundles through the analysis
layer; never computes a share of its own.
"""
