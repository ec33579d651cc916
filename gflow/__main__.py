"""``python -m gflow`` is the ``gflow`` command."""

import sys

from .cli import main

sys.exit(main())
