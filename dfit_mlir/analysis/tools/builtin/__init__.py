"""The built-in tools. None of them imports an adapter or reads a backend's artifacts:
they see only the semantic model (a test checks the imports)."""
