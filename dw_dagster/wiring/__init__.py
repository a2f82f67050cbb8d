"""What build_dw_definitions assembles besides the core loop (one module per piece)."""
