"""The one exception type for bad input."""


class FathomError(Exception):
    """An error caused by the user's input; the message names the problem and the fix.

    The CLI prints it without a traceback and exits with status 2.
    """


DISTRIBUTION = "fathom-depth"
"""The distribution name (``pip``); ``fathom`` on PyPI is an unrelated project."""


def install_hint(extra: str) -> str:
    """How to install an optional extra from a Fathom checkout (there is no PyPI release)."""
    return f"pip install -e '.[{extra}]' in the Fathom checkout (distribution {DISTRIBUTION})"
