"""The one exception type for bad input."""


class FathomError(Exception):
    """An error caused by the user's input; the message names the problem and the fix.

    The CLI prints it without a traceback and exits with status 2.
    """
