"""WikiHop (QAngaroo v1.1)."""
