"""``python -m graphamp.cli``: the same as the ``graphamp`` command."""

import sys

from graphamp.cli import main

sys.exit(main())
