"""``python -m deltaflow.cli``: the same as the ``deltaflow`` command."""

import sys

from deltaflow.cli import main

sys.exit(main())
