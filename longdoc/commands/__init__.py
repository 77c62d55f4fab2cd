"""Thin adapters between the `longdoc` command line and the library."""
