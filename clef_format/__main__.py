"""``python -m clef_format`` is the ``clef-format`` command."""

import sys

from clef_format.cli import main

sys.exit(main())
