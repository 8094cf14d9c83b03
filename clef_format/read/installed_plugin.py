"""The clef-vllm installed in a Python environment: the plugin ``vllm serve`` there would load.

In the running interpreter the answer is ``importlib.metadata``'s; since importing it costs more than
the rest of verify's start, the folders on ``sys.path`` are first listed for a ``clef_vllm-*`` metadata
folder (``.dist-info`` / ``.egg-info``, the names importlib.metadata's finder matches) and
importlib.metadata is asked only when one is there. In another environment (``--python PATH``,
resolved as a shell resolves a command: ``resolve_python``) that interpreter runs, isolated (``-I``:
no PYTHONPATH, no current folder on its path; its user site-packages is added back, as a plain start
would have it), a short script that prints the answer
as one JSON object, with a token it computes in Python from a random nonce (so a program that only
prints JSON is not taken for an interpreter). It gets ``PYTHON_TIMEOUT_S`` seconds and at most
``MAX_ANSWER_BYTES`` of its output is read.
"""

from __future__ import annotations

import json
import os
import sys

from clef_format.errors import UsageError
from clef_format.records import Record

#: The distribution the serving plugin is installed as.
DIST = "clef-vllm"
#: Seconds the other interpreter may take to answer (its whole process group is killed then).
PYTHON_TIMEOUT_S = 20
#: Bytes of the end of each output kept: the answer is the last line, one short JSON object (what a
#: sitecustomize or a .pth prints before it is read past, never kept whole).
MAX_ANSWER_BYTES = 16 * 1024
#: Bytes of output read at most: a program that says more is stopped (memory stays MAX_ANSWER_BYTES).
MAX_READ_BYTES = 16 * 1024 * 1024

_SCRIPT = """\
import hashlib, json, os, site, sys
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
vi = list(sys.version_info[:3])
out["python"] = vi
out["token"] = hashlib.sha256((sys.argv[1] + repr(vi)).encode()).hexdigest()
print(json.dumps(out))
"""


def _token(nonce: str, version_info: object) -> str:
    """What the probe computes in Python: proof that the answer came from an interpreter that ran it."""
    import hashlib

    return hashlib.sha256((nonce + repr(version_info)).encode()).hexdigest()


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


#: How often the output loop looks whether the program has exited (its children may keep the pipes open).
_EXITED_POLL_S = 0.05


def _run_bounded(argv: list[str], cwd: str) -> tuple[int | None, bytes, bytes, bytes]:
    """Run ``argv`` for at most ``PYTHON_TIMEOUT_S`` seconds, keeping the last ``MAX_ANSWER_BYTES`` of each
    output and reading at most ``MAX_READ_BYTES`` of them (a program that says more is stopped); returns
    the exit status (``None`` when stopped at the deadline), stdout's and stderr's ends, and stdout's first
    bytes when it was stopped for saying too much (else ``b""``). It runs in its own process group,
    killed as a whole at the end (a child left holding the pipes cannot keep verify waiting)."""
    import selectors
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=cwd, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None  # both are PIPEs
    kept = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    first = bytearray()
    read = 0
    deadline = time.monotonic() + PYTHON_TIMEOUT_S
    timed_out = full = False
    try:
        with selectors.DefaultSelector() as sel:
            for stream in kept:
                sel.register(stream, selectors.EVENT_READ)
            while sel.get_map() and not full:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                events = sel.select(timeout=min(left, _EXITED_POLL_S))
                if not events and proc.poll() is not None:
                    break  # it has exited and said all it had: a child left holding the pipes is not waited for
                for key, _ in events:
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    buf = kept[key.fileobj]  # type: ignore[index]  # one of the two pipes registered above
                    if key.fileobj is proc.stdout and len(first) < 200:
                        first += chunk[:200 - len(first)]
                    buf += chunk
                    del buf[:-MAX_ANSWER_BYTES]
                    read += len(chunk)
                    full = read > MAX_READ_BYTES
        if not (timed_out or full):
            try:
                proc.wait(timeout=max(0.01, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the program when stopped; children it left running
        except OSError:
            pass
        proc.wait()
        for stream in kept:
            stream.close()
    return ((None if timed_out else proc.returncode), bytes(kept[proc.stdout]), bytes(kept[proc.stderr]),
            bytes(first) if full else b"")


def _said(out: bytes, err: bytes) -> str:
    """What the program printed, one line and cut, for the message (stderr first: where errors go)."""
    for data in (err, out):
        lines = [ln.strip() for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
        if lines:
            line = lines[-1]
            return repr(line[:200] + ("..." if len(line) > 200 else ""))
    return "no output"


#: What ``--python`` takes, said in every refusal of it.
PYTHON_FIX = ("give --python the environment's interpreter: a path (/path/to/venv/bin/python, or .venv/bin/python "
              "from the current folder) or a command on PATH (python3)")


def resolve_python(python: str) -> str:
    """``--python`` resolved as a shell resolves a command: a name with a ``/`` is a path (a relative one
    from the current folder), a bare name is looked up on ``PATH``. The result is absolute and keeps
    symlinks (a venv's ``bin/python`` is one, and resolving it would leave the venv). ``UsageError``
    when nothing executable is there."""
    import shutil

    if not python:
        raise UsageError("--python is empty: it names no interpreter", fix=PYTHON_FIX)
    if "/" not in python and not (os.altsep and os.altsep in python):
        found = shutil.which(python)
        if found is None:
            here = os.path.join(python, "bin", "python") if os.path.isdir(python) else python
            fix = (f"a name without a / is a command on PATH, as in a shell: to mean the one in the current "
                   f"folder, give --python ./{here}" if os.path.exists(here) else PYTHON_FIX)
            raise UsageError(f"--python {python}: no command of that name on PATH", fix=fix)
        return os.path.abspath(found)
    path = os.path.abspath(python)
    shown = python if path == python else f"{python} ({path})"
    if not os.path.exists(path):
        raise UsageError(f"--python {shown}: no such file", fix=PYTHON_FIX)
    if os.path.isdir(path):
        inner = os.path.join(path, "bin", "python")
        fix = f"give the interpreter inside it: --python {inner}" if os.path.isfile(inner) else PYTHON_FIX
        raise UsageError(f"--python {shown} is a folder, not an interpreter", fix=fix)
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise UsageError(f"--python {shown} is not an executable file", fix=PYTHON_FIX)
    return path


def installed_in(python: str) -> InstalledPlugin:
    """clef-vllm in the environment of interpreter ``python`` (as ``resolve_python`` finds it); ``UsageError``
    when it does not run as one."""
    import secrets

    fix = PYTHON_FIX
    python = resolve_python(python)
    nonce = secrets.token_hex(16)
    try:
        code, out, err, flood = _run_bounded([python, "-I", "-c", _SCRIPT, nonce],
                                             os.path.dirname(os.path.abspath(python)))
    except OSError as exc:
        raise UsageError(f"--python {python}: cannot run it ({exc.strerror or exc})", fix=fix) from None
    if code is None:
        raise UsageError(f"--python {python}: no answer within {PYTHON_TIMEOUT_S} s (it was stopped)", fix=fix)
    lines = out.decode("utf-8", "replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if code == 0 and lines else None
    except ValueError:
        answer = None
    if flood:
        raise UsageError(f"--python {python} did not run as a Python interpreter: it printed more than "
                         f"{MAX_READ_BYTES} bytes (stopped there; it began {_said(flood, b'')})", fix=fix)
    if not (isinstance(answer, dict) and isinstance(answer.get("version"), (str, type(None)))
            and isinstance(answer.get("python"), list) and answer.get("token") == _token(nonce, answer["python"])):
        raise UsageError(f"--python {python} did not run as a Python interpreter (exit {code}: "
                         f"{_said(out, err)})", fix=fix)
    location = answer.get("location")
    return InstalledPlugin("python", python, answer["version"], location if isinstance(location, str) else None)
