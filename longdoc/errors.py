"""The one exception type for bad user input.

Library code raises `InputError` (a `ValueError`) with a message that names the file, line, field
or argument at fault; the command line prints that message and exits with status 2 instead of a
traceback.
"""


class InputError(ValueError):
    """Bad input from a user: a file, a field, an argument. The message says which and why."""
