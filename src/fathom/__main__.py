"""``python -m fathom``: the ``fathom`` command."""

import sys

from fathom.cli import main

sys.exit(main())
