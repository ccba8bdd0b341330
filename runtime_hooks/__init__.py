"""IREE runtime hooks: boundary events keyed by dfit IDs.

``hal_profile`` captures per-dispatch HAL profiling events with the shipped tools and
joins them to the manifest's dispatch call sites. The policy-driven ``dfit run`` and the
in-process API build on it (the runtime issue)."""
