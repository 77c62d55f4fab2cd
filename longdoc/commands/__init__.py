"""Thin adapters between the `longdoc` command line and the library."""

# The shell's status for a program stopped by Ctrl-C (128 + SIGINT's 2).
INTERRUPTED_STATUS = 130
