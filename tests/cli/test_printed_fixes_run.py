"""Printed fixes run as pasted: the command a finding or a refusal prints, taken from the real CLI's output
for a checkpoint at an awkward path (a space, ``$x``, a leading ``-``, quotes, non-ASCII letters), is run in a
real shell (``bash -c``) with the real CLI, and then does what it says (verify afterwards is OK, the warning
is gone, the scan finds nothing broken). One rule quotes every path of a printed command
(``clef_format/shell.py``); a fix built without it is cut at the first space here, reads ``$x`` as a
variable, or hands the path to the option parser.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from tests.support.broken import BROKEN, build_broken
from tests.support.hub_cache import build_hub_cache, fake_commit

ROOT = Path(__file__).resolve().parents[2]

#: Folder names a user may really have: each breaks an unquoted command in its own way. ``$x`` is set in
#: the shell below, so an unquoted ``$x`` names another folder rather than none.
AWKWARD = ["my ck", "$x ck", "-ck", "it's \"q\"", "café ✓", "-it's $x \"q\" café"]
#: All of them in one name, for the tests that build many checkpoints.
WORST = "-it's $x \"q\" café"

#: One word of a POSIX shell command as ``shlex.quote`` writes one (quoted pieces, concatenated), or a
#: plain word; prose around a command (``,`` ``;`` ``(``) ends it.
WORD = r"""(?:'[^']*'|"(?:[^"\\]|\\.)*"|[^\s'";,()`])+"""
#: A path of a command: never a flag, nor a placeholder such as PATH or COPY (guidance, not a command to paste).
PATH_WORD = rf"(?![A-Z]+\b|-){WORD}"
#: The commands a fix may print, whole: what is pasted.
COMMANDS = re.compile(
    rf"(?:mkdir -p {WORD} && )?clef-format scan(?: {WORD})*? --fixable --into {WORD}"
    rf"|clef-format migrate {PATH_WORD} --to {WORD}(?: --output {WORD})?"
    rf"|clef-format migrate {PATH_WORD} --(?:abort|current)"
    rf"|clef-format (?:verify|manifest)(?: --deep)? {PATH_WORD}(?: --deep| --force)?"
    rf"|\bcd {WORD}")


#: Where a fix names a clef-format command (not on a placeholder such as PATH, nor a flag alone such as --help).
MENTIONS = re.compile(r"clef-format (?:migrate|verify|manifest|scan)(?: --deep)? (?![A-Z]+\b|--help|--history|--dry-run)")


def commands_in(fix: str | None) -> list[str]:
    """The commands of a fix, whole; every clef-format command it names must be one (else it is cut, as an
    unquoted path with a space is)."""
    found = [m.group(0) for m in COMMANDS.finditer(fix or "")]
    assert len(MENTIONS.findall(fix or "")) == sum(c.count("clef-format ") for c in found), (fix, found)
    return found


@pytest.fixture
def shell(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """``shell(command, cwd, **env)``: ``bash -c command`` where ``clef-format`` is this tree's CLI, ``$x`` is
    set, and the Hugging Face cache is an empty folder unless ``HF_HUB_CACHE`` is given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "clef-format"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m clef_format \"$@\"\n")
    shim.chmod(0o755)
    (tmp_path / "empty-hub").mkdir()

    def run(command: str | list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "x": "elsewhere",
               "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-hub"), **extra}
        argv = ["bash", "-c", command] if isinstance(command, str) else [sys.executable, "-m", "clef_format", *command]
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)

    return run


def _json(proc: subprocess.CompletedProcess[str]) -> dict:
    return json.loads(proc.stdout)


def _place(built_dir: Path, where: Path) -> Path:
    shutil.copytree(built_dir, where, symlinks=True)
    return where


def _verify(shell, cwd: Path, name: str, *extra: str) -> dict:
    """``clef-format verify --json [extra] -- NAME`` as a user types it (``--``: a name starting with ``-``)."""
    return _json(shell(["verify", "--json", *extra, "--", name], cwd))


def _fix_of(report: dict, code: str) -> str:
    (fix,) = {f["fix"] for f in report["findings"] if f["code"] == code}
    return fix


# ---- verify's fixes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", AWKWARD)
@pytest.mark.parametrize("layout, code", [("layout-1", "legacy-layout"), ("layout-2-unmarked", "marker-missing")])
def test_verify_fix_runs_and_the_finding_is_gone(built, shell, tmp_path: Path, name: str, layout: str,
                                                 code: str) -> None:
    _place(built(layout), tmp_path / name)
    fix = _fix_of(_verify(shell, tmp_path, name), code)
    (command,) = commands_in(fix)
    ran = shell(command, tmp_path)
    assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
    after = _verify(shell, tmp_path, name)
    assert after["ok"] and after["layout"] == "layout-2" and code not in {f["code"] for f in after["findings"]}, after
    assert not (tmp_path / "elsewhere ck").exists()


@pytest.mark.parametrize("name", ["my ck", "-ck", WORST])
def test_plugin_version_fixes_run(built, shell, tmp_path: Path, name: str) -> None:
    """--plugin-version 0.1.4 on layout-2: install the shipped plugin, or migrate for 0.1.x: the migrate runs."""
    _place(built("layout-2"), tmp_path / name)
    fix = _fix_of(_verify(shell, tmp_path, name, "--plugin-version", "0.1.4"), "plugin-incompatible")
    (command,) = commands_in(fix)
    assert shell(command, tmp_path).returncode == 0, command
    assert _verify(shell, tmp_path, name, "--plugin-version", "0.1.4")["ok"]


def test_the_bundled_plugin_folder_named_in_pip_install_is_the_folder(built, shell, tmp_path: Path) -> None:
    """bundled-plugin-mismatch: ``pip install DIR/vllm_plugin``: the word pasted names that very folder."""
    root = _place(built("layout-2"), tmp_path / WORST)
    plugin = root / "vllm_plugin"
    plugin.mkdir()
    (plugin / "pyproject.toml").write_text('[project]\nname = "clef-vllm"\nversion = "0.1.4"\n')
    fix = _fix_of(_verify(shell, tmp_path, WORST), "bundled-plugin-mismatch")
    word = re.search(rf"pip install ({WORD})", fix).group(1)
    probe = shell(f"test -d {word} && test -f {word}/pyproject.toml", tmp_path)
    assert probe.returncode == 0, word


def test_every_fix_of_the_broken_fixtures_runs_at_an_awkward_path(shell, tmp_path: Path) -> None:
    """Every broken state at the worst name: each command any fix prints runs (never exit 2: it parsed and
    found its checkpoint), and a migrate command removes its finding unless other errors block it (then it
    refuses, exit 1)."""
    for case in sorted(BROKEN):
        work = tmp_path / case
        work.mkdir()
        root = build_broken(work / WORST, case)
        report = _verify(shell, work, WORST)
        for finding in report["findings"]:
            for command in commands_in(finding.get("fix")):
                ran = shell(command, work)
                assert ran.returncode in (0, 1), (case, finding, command, ran.stdout, ran.stderr)
                if " --to " not in command:
                    continue
                others = [f for f in report["findings"] if f["severity"] == "error" and f["code"] != finding["code"]]
                assert ran.returncode == (1 if others else 0), (case, finding, command, ran.stdout)
                if not others:
                    assert finding["code"] not in {f["code"] for f in _verify(shell, work, WORST)["findings"]}
        assert root.is_dir()
        shutil.rmtree(work)


def test_the_tables_metadata_advice_names_no_command_that_does_nothing(built, shell, tmp_path: Path) -> None:
    """A tables file without provenance (the release's own may lack it): nothing to do to serve. The advice
    once said to re-create it with ``clef-format migrate``, which on layout-2 does nothing at all."""
    from clef_format.spec import layouts as L
    from tests.support.hostile_cases import edit_header

    root = _place(built("layout-2"), tmp_path / "my ck")
    def drop_quality(header: dict) -> None:
        del header["__metadata__"]["quality"]

    edit_header(L.TABLES, drop_quality)(root)
    fixes = [f["fix"] for f in _verify(shell, tmp_path, "my ck")["findings"] if f["code"] == "tables-metadata"]
    assert fixes
    for fix in fixes:
        for command in commands_in(fix):  # a command, if one is printed, must remove the warning
            assert shell(command, tmp_path).returncode == 0
            assert "tables-metadata" not in {f["code"] for f in _verify(shell, tmp_path, "my ck")["findings"]}
        assert "clef-format migrate" not in fix or commands_in(fix), fix


# ---- migrate: the final report names the result -----------------------------------------------------------

@pytest.mark.parametrize("name", AWKWARD)
@pytest.mark.parametrize("spelled", ["space", "equals"])
def test_migrate_output_advice_names_the_output(built, shell, tmp_path: Path, name: str, spelled: str) -> None:
    """After ``--output DIR`` the verify advice of the result names DIR (never the workspace it was staged
    in, never ``=DIR``), and runs."""
    if spelled == "space" and name.startswith("-"):
        pytest.skip("argparse takes '--output -x' for a missing value: a user types --output=-x")
    _place(built("layout-2"), tmp_path / "src")
    option = ["--output", name] if spelled == "space" else [f"--output={name}"]
    report = _json(shell(["migrate", "src", "--to", "layout-1", *option, "--json"], tmp_path))
    fix = _fix_of(report, "legacy-layout")
    assert ".clef-migrate" not in fix and "=" + name not in fix, fix
    (command,) = commands_in(fix)
    assert shell(command, tmp_path).returncode == 0, command
    after = _verify(shell, tmp_path, name)
    assert after["ok"] and after["layout"] == "layout-2", after
    assert _verify(shell, tmp_path, "src")["layout"] == "layout-2"  # the source was only read


def test_migrating_the_folder_the_shell_is_in_says_how_to_get_back(built, shell, tmp_path: Path) -> None:
    root = _place(built("layout-1"), tmp_path / WORST)
    report = _json(shell(["migrate", ".", "--to", "layout-2", "--json"], root))
    (command,) = commands_in(_fix_of(report, "workdir-replaced"))
    again = shell(f"{command} && clef-format verify --json .", tmp_path)
    assert again.returncode == 0 and _json(again)["layout"] == "layout-2", again.stderr


def test_the_original_release_is_not_sent_to_verify(built, shell, tmp_path: Path) -> None:
    """No migration starts from the original BF16 release, and verify finds nothing wrong with it: the
    refusal's fix must not be "run verify and fix what it reports"."""
    _place(built("original-release"), tmp_path / "orig")
    report = _json(shell(["migrate", "orig", "--to", "layout-2", "--json"], tmp_path))
    (refusal,) = report["findings"]
    assert refusal["code"] == "migrate-refused" and not commands_in(refusal["fix"]), refusal
    assert "download" in refusal["fix"]
    assert _verify(shell, tmp_path, "orig")["ok"]


# ---- example ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["my ck", "$x ck", WORST])
def test_the_example_commands_advice_runs(shell, tmp_path: Path, name: str) -> None:
    report = _json(shell(["example", "--layout", "layout-1", "--json", "--", name], tmp_path))
    (command,) = commands_in(_fix_of(report, "legacy-layout"))
    assert shell(command, tmp_path).returncode == 0, command
    assert _verify(shell, tmp_path, name)["ok"]


def test_example_where_nothing_can_be_written_is_not_told_to_wait(shell, tmp_path: Path) -> None:
    """/proc takes no new file: no lock can be made there. The fix once said to wait for another run."""
    proc = shell(["example", "/proc/clef-format-example", "--json"], tmp_path)
    (finding,) = _json(proc)["findings"]
    assert proc.returncode in (1, 2) and "wait" not in finding["fix"], finding
    assert not os.path.exists("/proc/clef-format-example")


def test_a_path_through_proc_is_advised_as_it_leads(built, shell, tmp_path: Path) -> None:
    """``/proc/self/cwd/NAME`` leads to NAME in the folder the command runs in: the advice, pasted in the same
    folder, migrates that checkpoint."""
    _place(built("layout-1"), tmp_path / "my ck")
    fix = _fix_of(_verify(shell, tmp_path, "/proc/self/cwd/my ck"), "legacy-layout")
    (command,) = commands_in(fix)
    assert shell(command, tmp_path).returncode == 0, command
    assert _verify(shell, tmp_path, "my ck")["layout"] == "layout-2"


# ---- scan ---------------------------------------------------------------------------------------------------

def _cache_with_an_unmarked_snapshot(built, cache: Path) -> Path:
    return build_hub_cache(cache, "kurcontko/clef-flash-NVFP4-Hybrid", built("layout-2-unmarked"),
                           commit=fake_commit("unmarked"))


def _tree(root: Path) -> dict[str, object]:
    return {str(p.relative_to(root)): (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def test_scan_fixable_script_runs_for_awkward_folders(built, shell, tmp_path: Path) -> None:
    """A ROOT given as ``-- "-my models"`` and copies at every awkward name below it: the script, pasted, fixes
    every copy."""
    models = tmp_path / "-my models"
    for name in AWKWARD:
        _place(built("layout-2-unmarked"), models / name)
    script = shell(["scan", "--fixable", "--", "-my models"], tmp_path)
    assert script.returncode == 1 and script.stdout.count("clef-format migrate") == len(AWKWARD), script
    ran = shell(script.stdout, tmp_path)
    assert ran.returncode == 0, (script.stdout, ran.stderr)
    after = _json(shell(["scan", "--json", "--", "-my models"], tmp_path))
    assert after["totals"]["broken"] == 0, after["totals"]


def test_scan_into_a_link_into_the_cache_is_refused_and_its_fix_runs(built, shell, tmp_path: Path) -> None:
    """``--into`` through a symlink leading into the cache: judged where it leads, refused before a
    mkdir or a migrate could write there; the fix, pasted, scans into ~/clef-models (made first), and the
    script it prints fixes the copy; the cache is unchanged throughout."""
    cache = tmp_path / "hub"
    _cache_with_an_unmarked_snapshot(built, cache)
    (cache / "parked").mkdir()
    (tmp_path / "into me").symlink_to(cache / "parked")
    before = _tree(cache)
    home = tmp_path / "h o-me"
    home.mkdir()
    env = {"HF_HUB_CACHE": str(cache), "HOME": str(home)}
    for into in ("into me", "into me/new", str(cache)):  # "new" does not exist: a mkdir there would write the cache
        proc = shell(["scan", "--fixable", "--into", into, "--json"], tmp_path, **env)
        (finding,) = _json(proc)["findings"]
        assert proc.returncode == 2 and "Hugging Face cache" in finding["message"], finding
        assert str(cache) not in finding["fix"] and "into me" not in finding["fix"], finding
    text = shell(["scan", "--fixable", "--into", "into me"], tmp_path, **env)
    (command,) = commands_in(text.stderr.split("fix: ", 1)[1])
    script = shell(command, tmp_path, **env)
    assert script.returncode == 1 and "--output" in script.stdout, (command, script.stderr)
    assert shell(script.stdout, tmp_path, **env).returncode == 0, script.stdout
    fixed = [p for p in (home / "clef-models").iterdir()]
    assert len(fixed) == 1 and _verify(shell, tmp_path, str(fixed[0]), **{})["ok"]
    assert _tree(cache) == before


def test_scan_into_advice_never_leads_into_the_cache(built, shell, tmp_path: Path) -> None:
    """A home folder inside the cache: ~/clef-models would be in it too, so the fix names no folder there."""
    cache = tmp_path / "hub"
    _cache_with_an_unmarked_snapshot(built, cache)
    home = cache / "home"
    home.mkdir()
    proc = shell(["scan", "--fixable", "--into", str(home), "--json"], tmp_path, HF_HUB_CACHE=str(cache),
                 HOME=str(home))
    (finding,) = _json(proc)["findings"]
    assert proc.returncode == 2 and not commands_in(finding["fix"]) and "mkdir" not in finding["fix"], finding
