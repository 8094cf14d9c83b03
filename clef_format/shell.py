"""The one rule for a path inside a command clef-format prints (a finding's or a refusal's fix).

A printed command is meant to be pasted into a POSIX shell as it is: a path holding a space, a quote,
``$``, a glob character or non-ASCII letters must reach the command as the one word it is
(``shlex.quote``), and a relative path starting with ``-`` must not be read as an option (``./`` is
put before it: the same file, a word no option parser takes for a flag). Every fix that names a path
in a command builds it here; ``tests/cli/test_printed_fixes_run.py`` runs them in a real shell.
"""

from __future__ import annotations


def quote(word: str) -> str:
    """``word`` as one word of a POSIX shell command (``shlex.quote``), for a value that is no path."""
    from shlex import quote as _quote  # shlex only when a command is printed: verify's fast path needs none

    return _quote(word)


def quote_path(path: str) -> str:
    """``path`` as one word of a POSIX shell command that names that file or folder and is never an
    option: ``my ck`` -> ``'my ck'``, ``-ck`` -> ``./-ck``, ``it's`` -> ``'it'"'"'s'``."""
    if path.startswith("-"):
        path = "./" + path
    return quote(path)
