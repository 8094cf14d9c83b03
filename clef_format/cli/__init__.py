"""argv -> exit status: the ``clef-format`` command, its subcommands, rendering and progress bars."""

from clef_format.cli.main import main

__all__ = ["main"]
