"""Ways to look at a dfit bundle: the self-contained HTML view and Model Explorer."""
