"""Backend adapters and their capability descriptors (IREE: compiler-visible path)."""
