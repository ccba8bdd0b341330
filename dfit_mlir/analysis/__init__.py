"""Analysis: the semantic model read from a bundle (``model``), the ledger that computes
every figure a user reads (``ledger``), the device profiles and calibration of the time
model, and the tools (``tools``: the tool API, registry, session and built-in tools).

Inside this layer the ledger sits on the model, and the tools on the ledger.
"""
