"""Natural Questions (original and simplified formats)."""
