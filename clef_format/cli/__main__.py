"""``python -m clef_format.cli`` is the ``clef-format`` command."""

import sys

from clef_format.cli.main import main

sys.exit(main())
