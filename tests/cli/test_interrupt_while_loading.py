"""A Ctrl-C while clef-format is still importing its modules is an interruption like any other:
exit 2 and, with ``--json``, exactly one JSON object, never a traceback. Generated, not listed: every
module a command imports is interrupted in turn (a meta-path finder raises KeyboardInterrupt at
its first import, as a signal arriving there would), in a fresh interpreter each time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clef_format.fixtures.builders import build_checkpoint

#: Imported before ``main`` runs (the console script's ``from clef_format.cli import main``): the only
#: window where a Ctrl-C is Python's own traceback. Keep it to these light modules.
BEFORE_MAIN = {"__future__", "gc", "clef_format", "clef_format.cli", "clef_format.cli.main", "clef_format.cli.commands",
               "clef_format.errors"}

#: Modules placed in ``sys.modules`` by another import, never searched for (no finder runs: nothing to interrupt).
ALIASES = {"importlib._bootstrap", "importlib._bootstrap_external", "typing.io", "typing.re"}

_PROBE = r"""
import os, sys
before = set(sys.modules)
from clef_format.cli import main
loaded_before_main = sorted(set(sys.modules) - before)
argv = sys.argv[1:]
sys.stdout = open(os.devnull, "w")
main(argv)
loaded = sorted(set(sys.modules) - before)
import json
print(json.dumps([loaded_before_main, loaded]), file=sys.__stdout__)
"""

_INTERRUPT_AT = r"""
import sys
target = sys.argv[1]
class InterruptAt:
    fired = False
    def find_spec(self, name, path=None, target_module=None):
        if name == target and not InterruptAt.fired:
            InterruptAt.fired = True
            raise KeyboardInterrupt
        return None
sys.meta_path.insert(0, InterruptAt())
from clef_format.cli import main
code = main(sys.argv[2:])
print("FIRED" if InterruptAt.fired else "NOT-FIRED", file=sys.stderr)
sys.exit(code)
"""


def _argvs(tmp: str) -> dict[str, list[str]]:
    from pathlib import Path

    ck = build_checkpoint(Path(tmp) / "ck", layout="layout-1", build="fp8")
    return {"verify": ["verify", str(ck), "--json"],
            "migrate": ["migrate", str(ck), "--dry-run", "--json"],
            "layers": ["layers", str(ck), "--json"]}


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """Per command: its argv, and the modules it imports (beyond the interpreter's start), in a fresh process."""
    argvs = _argvs(str(tmp_path_factory.mktemp("interrupt")))
    out = {}
    for name, argv in argvs.items():
        probe = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True,
                               check=True)
        before_main, loaded = json.loads(probe.stdout.strip().splitlines()[-1])
        out[name] = (argv, before_main, loaded)
    return out


def test_only_light_modules_load_before_main(commands):
    for argv, before_main, _ in commands.values():
        assert set(before_main) <= BEFORE_MAIN, set(before_main) - BEFORE_MAIN


@pytest.mark.parametrize("command", ["verify", "migrate", "layers"])
def test_a_ctrl_c_at_any_import_is_one_json_report(commands, command):
    argv, before_main, loaded = commands[command]
    inside = [m for m in loaded if m not in before_main]
    assert len(inside) > 20  # the command's modules, argparse, json... (the enumeration is not empty)
    for module in inside:
        r = subprocess.run([sys.executable, "-c", _INTERRUPT_AT, module, *argv],
                           capture_output=True, text=True)
        if r.stderr.splitlines()[-1:] == ["NOT-FIRED"]:  # set in sys.modules without a finder: no window
            assert module in ALIASES, module
            continue
        assert "Traceback" not in r.stderr, (module, r.stderr)
        assert r.returncode == 2, (module, r.returncode, r.stderr)
        report = json.loads(r.stdout)  # exactly one JSON object: json.loads refuses anything after it
        assert report["command"] == command and report["ok"] is False, module
        assert report["findings"][0]["code"] == "interrupted", (module, report)
