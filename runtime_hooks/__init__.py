"""IREE runtime hooks (boundary events keyed by dfit IDs). The compile side writes the
manifest these hooks join against; the hooks themselves are the runtime issue's scope."""
