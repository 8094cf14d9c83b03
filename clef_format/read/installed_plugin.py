"""The clef-vllm installed in a Python environment: the plugin ``vllm serve`` there would load.

In the running interpreter the answer is ``importlib.metadata``'s; since importing it costs more than
the rest of verify's start, the folders on ``sys.path`` are first listed for a ``clef_vllm-*`` metadata
folder (``.dist-info`` / ``.egg-info``, the names importlib.metadata's finder matches) and
importlib.metadata is asked only when one is there. In another environment (``--python PATH``) that
interpreter runs, isolated (``-I``: no PYTHONPATH, no current folder on its path; its user
site-packages is added back, as a plain start would have it), a short script that prints the answer
as one JSON object.
"""

from __future__ import annotations

import json
import os
import sys

from clef_format.errors import UsageError
from clef_format.records import Record

#: The distribution the serving plugin is installed as.
DIST = "clef-vllm"
#: Seconds the other interpreter may take to answer.
PYTHON_TIMEOUT_S = 60

_SCRIPT = """\
import json, os, site, sys
user = site.getusersitepackages() if hasattr(site, "getusersitepackages") else None
if user and os.path.isdir(user) and user not in sys.path:
    sys.path.append(user)
from importlib import metadata
try:
    d = metadata.distribution("clef-vllm")
    out = {"version": d.version, "location": str(d.locate_file(""))}
except metadata.PackageNotFoundError:
    out = {"version": None, "location": None}
out["executable"] = sys.executable
print(json.dumps(out))
"""


class InstalledPlugin(Record):
    """clef-vllm as one environment has it: ``version`` ``None`` when it is not installed there.
    ``source`` is ``installed`` (the running interpreter) or ``python`` (``--python PATH``)."""

    source: str
    python: str
    version: str | None
    location: str | None

    @property
    def where(self) -> str:
        return self.python + (f": {self.location}" if self.location else "")


def _maybe_installed() -> bool:
    """Whether some ``sys.path`` folder holds clef-vllm metadata (a zip on the path: ask importlib)."""
    for entry in sys.path:
        folder = entry or "."
        try:
            names = os.listdir(folder)
        except NotADirectoryError:
            return True  # a zip archive: importlib.metadata reads it
        except OSError:
            continue
        for name in names:
            low = name.lower().replace("-", "_").replace(".", "_")
            if low.startswith("clef_vllm") and low.endswith(("_dist_info", "_egg_info")):
                return True
    return False


def installed_here() -> InstalledPlugin:
    """clef-vllm in the running interpreter."""
    if not _maybe_installed():
        return InstalledPlugin("installed", sys.executable, None, None)
    from importlib import metadata

    try:
        dist = metadata.distribution(DIST)
    except metadata.PackageNotFoundError:
        return InstalledPlugin("installed", sys.executable, None, None)
    return InstalledPlugin("installed", sys.executable, dist.version, str(dist.locate_file("")))


def installed_in(python: str) -> InstalledPlugin:
    """clef-vllm in the environment of interpreter ``python``; ``UsageError`` when it does not run as one."""
    import subprocess

    fix = "give --python the path of the environment's python (e.g. /path/to/venv/bin/python)"
    if not os.path.isfile(python) or not os.access(python, os.X_OK):
        raise UsageError(f"--python {python}: no executable file there", fix=fix)
    try:
        done = subprocess.run([python, "-I", "-c", _SCRIPT], capture_output=True, timeout=PYTHON_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, cwd=os.path.dirname(os.path.abspath(python)))
    except subprocess.TimeoutExpired:
        raise UsageError(f"--python {python}: no answer within {PYTHON_TIMEOUT_S} s", fix=fix) from None
    except OSError as exc:
        raise UsageError(f"--python {python}: cannot run it ({exc.strerror or exc})", fix=fix) from None
    lines = done.stdout.decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("version"), (str, type(None))):
        said = (done.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"])[-1][:200]
        raise UsageError(f"--python {python} did not run as a Python interpreter (exit {done.returncode}: {said})",
                         fix=fix)
    location = answer.get("location")
    return InstalledPlugin("python", python, answer["version"], location if isinstance(location, str) else None)
