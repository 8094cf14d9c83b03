"""Where the outcome cannot be printed, and arguments of every type, per the contract (README, "Exit status").

* stdout or stderr unwritable (a full disk: /dev/full; a closed descriptor; EIO: a terminal whose other
  end is gone) is exit 2 ``unwritable``; in JSON mode the object cannot reach stdout, so stderr gets one
  line; with both unwritable the exit status alone says it. A reader that left (broken pipe,
  ``| head -1``) is not an error: silent, and the command's own status.
* ``--help`` and ``--version`` with ``--json`` print one JSON object.
* An empty PATH is the same usage error for every command, and nothing is written anywhere.
* An exit-2 result carries exactly one finding with its code (two unreadable files included).
* The gate and its hooks take what ``verify --plugin-version`` takes, ``Version`` objects, and
  str/bytes/os.PathLike paths; anything else is a ``UsageError`` with a message and fix, never a TypeError.
"""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from clef_format.cli.commands import COMMANDS
from clef_format.errors import UsageError
from clef_format.spec.findings import COULD_NOT_RUN

CLI = [sys.executable, "-m", "clef_format"]
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
SETPRIV = shutil.which("setpriv")
UNPRIVILEGED = ([SETPRIV, "--bounding-set=-dac_override,-dac_read_search", "--"]
                if SETPRIV and os.geteuid() == 0 else [])


# ---- unwritable streams --------------------------------------------------------------------------------

def _stream(kind: str) -> tuple[int | None, list[int]]:
    """(the descriptor to give the child, descriptors to close here afterwards); None: closed in the child."""
    if kind == "full":
        fd = os.open("/dev/full", os.O_WRONLY)
        return fd, [fd]
    if kind == "eio":  # a terminal whose master is closed: every write is EIO
        master, slave = pty.openpty()
        os.close(master)
        return slave, [slave]
    if kind == "read-only":  # a descriptor open for reading only (1<&0): every write is EBADF
        fd = os.open(os.devnull, os.O_RDONLY)
        return fd, [fd]
    if kind == "gone-reader":  # a pipe whose reader left before anything was written
        r, w = os.pipe()
        os.close(r)
        return w, [w]
    return None, []


def _run(argv: list[str], stdout: str = "ok", stderr: str = "ok", cwd: Path | None = None
         ) -> tuple[int, str, str]:
    """Run the CLI with stdout/stderr each "ok" (captured), "full", "eio", "closed" or "gone-reader"."""
    fds, close_here = {}, []
    for name, kind in (("stdout", stdout), ("stderr", stderr)):
        if kind == "ok":
            fds[name] = subprocess.PIPE
        else:
            fd, extra = _stream(kind)
            close_here += extra
            fds[name] = fd if fd is not None else subprocess.DEVNULL

    closed = [n for n, k in ((1, stdout), (2, stderr)) if k == "closed"]

    def close_in_child() -> None:
        for n in closed:
            os.close(n)

    try:
        proc = subprocess.run([*CLI, *argv], stdout=fds["stdout"], stderr=fds["stderr"], env=ENV, cwd=cwd,
                              preexec_fn=close_in_child, timeout=300)
    finally:
        for fd in close_here:
            os.close(fd)
    out = proc.stdout.decode() if proc.stdout is not None else ""
    err = proc.stderr.decode() if proc.stderr is not None else ""
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def ck(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from clef_format.fixtures.builders import build_checkpoint

    return build_checkpoint(tmp_path_factory.mktemp("streams") / "ck", "layout-1", "bf16", num_layers=2)


def _commands(ck: Path) -> list[list[str]]:
    """A command that prints its outcome on stdout: ok (exit 0), with a warning, and one that could not run."""
    return [["codes"], ["verify", str(ck)], ["verify", str(ck), "--layers"], ["migrate", str(ck), "--dry-run"],
            ["verify", str(ck / "nope")]]


@pytest.mark.parametrize("kind", ["full", "eio", "closed"])
def test_scan_fixable_script_to_an_unwritable_stdout_is_exit_2(tmp_path: Path, kind: str) -> None:
    """``scan --fixable`` prints its script, not a report: a stdout that cannot take it is the same
    ``unwritable`` (exit 2, one line on stderr), never a traceback nor a lost script with exit 1."""
    from clef_format.fixtures.builders import build_checkpoint

    build_checkpoint(tmp_path / "models" / "unmarked", "layout-2-unmarked", "bf16", num_layers=2)
    rc, out, _ = _run(["scan", str(tmp_path / "models"), "--fixable"])
    assert rc == 1 and "clef-format migrate" in out  # the script, when stdout takes it
    rc, _, err = _run(["scan", str(tmp_path / "models"), "--fixable"], stdout=kind)
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("clef-format: unwritable: cannot write to stdout"), err


@pytest.mark.parametrize("kind", ["full", "eio", "closed"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_stdout_unwritable_is_exit_2_with_one_line_on_stderr(ck: Path, kind: str, as_json: bool) -> None:
    for argv in _commands(ck):
        if not as_json and argv[-1].endswith("nope"):
            continue  # text mode prints a could-not-run outcome on stderr: stdout is not needed
        rc, _, err = _run([*argv, *(["--json"] if as_json else [])], stdout=kind)
        assert rc == 2, (argv, kind, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("clef-format: unwritable: cannot write to stdout"), (argv, err)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_writer_whose_report_is_lost_says_its_work_is_done(ck: Path, tmp_path: Path, as_json: bool) -> None:
    """``migrate ... >/dev/full``: the disk of stdout fills only when the report is printed, after the
    migration. Exit 2 (unwritable) then must not read as "nothing happened": the one stderr line says the
    work is done, and it is. A command that writes nothing does not say so."""
    src = tmp_path / "src"
    shutil.copytree(ck, src)
    rc, _, err = _run(["migrate", str(src), "--to", "layout-2", *(["--json"] if as_json else [])], stdout="full")
    (line,) = err.splitlines()
    assert rc == 2 and line.startswith("clef-format: unwritable: cannot write to stdout"), err
    assert "only the report was lost: migrate ran to its end" in line, line
    rc, out, _ = _run(["verify", str(src), "--json"])
    assert json.loads(out)["layout"] == "layout-2"
    rc, _, err = _run(["verify", str(src), *(["--json"] if as_json else [])], stdout="full")
    assert rc == 2 and "ran to its end" not in err, err


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("kind", ["closed", "read-only"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_writer_with_no_stdout_is_refused_before_it_changes_anything(ck: Path, tmp_path: Path, kind: str,
                                                                      as_json: bool) -> None:
    """``clef-format migrate ... >&-``: its report could never be printed, so migrate, manifest and example
    refuse up front (exit 2, one line on stderr saying so) instead of writing and then failing to say what
    they did."""
    src = tmp_path / "src"
    shutil.copytree(ck, src)
    before = _files(tmp_path)
    for argv in (["migrate", str(src), "--to", "layout-2"], ["migrate", str(src), "--to", "layout-2", "--output",
                                                              str(tmp_path / "out")],
                 ["manifest", str(src)], ["example", str(tmp_path / "ex")]):
        rc, _, err = _run([*argv, *(["--json"] if as_json else [])], stdout=kind)
        assert rc == 2, (argv, err)
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("clef-format: unwritable: cannot write to stdout"), (argv, err)
        assert "refused before changing anything" in lines[0], err
        assert _files(tmp_path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["src"], argv


@pytest.mark.parametrize("kind", ["full", "eio", "closed"])
def test_stderr_unwritable_where_it_is_needed_is_exit_2_and_stdout_stays_clean(ck: Path, kind: str) -> None:
    rc, out, _ = _run(["verify", str(ck / "nope")], stderr=kind)  # text mode: the cause goes to stderr
    assert (rc, out) == (2, "")


def test_stderr_unwritable_for_examples_progress_line_is_exit_2(tmp_path: Path) -> None:
    rc, out, _ = _run(["example", str(tmp_path / "ex"), "--no-verify", "--json"], stderr="full")
    assert rc == 2 and out == "", out  # the JSON object is not printed after the line was lost


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("kind", ["full", "eio", "closed"])
def test_both_unwritable_is_exit_2_silently(ck: Path, kind: str, as_json: bool) -> None:
    for argv in _commands(ck):
        rc, _, _ = _run([*argv, *(["--json"] if as_json else [])], stdout=kind, stderr=kind)
        assert rc == 2, (argv, kind)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_a_reader_that_left_is_silent_and_keeps_the_status(ck: Path, as_json: bool) -> None:
    for argv, status in zip(_commands(ck), (0, 0, 0, 0, 2)):
        if not as_json and status == 2:
            continue
        rc, _, err = _run([*argv, *(["--json"] if as_json else [])], stdout="gone-reader")
        assert (rc, err) == (status, ""), (argv, err)


def test_head_1_stays_quiet(ck: Path) -> None:
    """As a user types it: the first line, nothing on stderr, head's status."""
    for argv in (["codes"], ["verify", str(ck), "--json"], ["codes", "--json"]):
        proc = subprocess.run(" ".join([*CLI, *argv]) + " | head -1", shell=True, capture_output=True, text=True,
                              env=ENV, timeout=300)
        assert proc.returncode == 0 and proc.stderr == "" and len(proc.stdout.splitlines()) == 1, proc.stderr


# ---- --help and --version with --json ---------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["--help"], ["-h"], ["--version"], *([c, "--help"] for c in COMMANDS)],
                         ids=lambda a: " ".join(a))
def test_help_and_version_with_json_print_one_json_object(argv: list[str]) -> None:
    from clef_format import __version__

    for where in ("after", "before"):
        full = [*argv, "--json"] if where == "after" or argv[0].startswith("-") else [argv[0], "--json", *argv[1:]]
        rc, out, err = _run(full)
        assert rc == 0, err
        payload = json.loads(out)  # exactly one object
        assert payload["ok"] is True and payload["findings"] == []
        assert payload["command"] == (argv[0] if argv[0] in COMMANDS else "clef-format")
        if "--version" in argv:
            assert payload["version"] == __version__
        else:
            assert payload["help"].startswith("usage: clef-format")
        text_rc, text, _ = _run(argv)
        assert text_rc == 0 and not text.startswith("{")  # without --json: argparse's own text
        assert (payload.get("help") or f"clef-format {payload['version']}\n") == text


# ---- an empty PATH ------------------------------------------------------------------------------------

PATH_COMMANDS = ["verify", "migrate", "layers", "manifest", "example"]


def test_every_command_with_a_path_is_here() -> None:
    from clef_format.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert sorted(PATH_COMMANDS) == sorted(n for n, p in sub.choices.items() if any(a.dest == "path" for a in p._actions))


@pytest.mark.parametrize("command", PATH_COMMANDS)
def test_an_empty_path_is_the_same_usage_error_for_every_command(command: str, tmp_path: Path) -> None:
    for argv in ([command, "", "--json"], [command, "--json", ""]):
        rc, out, _ = _run(argv, cwd=tmp_path)
        payload = json.loads(out)
        assert rc == 2 and [f["code"] for f in payload["findings"]] == ["usage-error"], payload
        assert payload["findings"][0]["fix"] and "PATH is empty" in payload["error"]
    rc, out, err = _run([command, ""], cwd=tmp_path)
    assert rc == 2 and out == "" and "PATH is empty" in err and "fix: " in err
    assert list(tmp_path.iterdir()) == []  # nothing written into the current directory


# ---- an empty option value, argparse's own errors, a path that is not a folder --------------------------

def _value_options() -> list[tuple[str, str]]:
    """(command, option) for every option that takes one value, from the parser itself."""
    from clef_format.cli.parser import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sorted((name, a.option_strings[-1]) for name, p in sub.choices.items() for a in p._actions
                  if a.option_strings and a.nargs is None and a.dest != "help")


def _in_process(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    from clef_format.cli.main import main

    capsys.readouterr()
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_every_value_option_is_here() -> None:
    assert {o for _, o in _value_options()} >= {"--python", "--plugin-version", "--vllm-version", "--output", "--to",
                                                "--into", "--jobs", "--layout", "--build"}


@pytest.mark.parametrize("command,opt", _value_options(), ids=[f"{c} {o}" for c, o in _value_options()])
def test_an_empty_option_value_is_a_usage_error(command: str, opt: str, ck: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """``--python ""`` and ``--python=``: an unset variable, refused before anything runs, never a default."""
    path = [] if command == "scan" else [str(tmp_path / "new") if command == "example" else str(ck)]
    rest = ["--fixable"] if opt == "--into" else ["--to", "layout-2"] if command == "migrate" and opt != "--to" else []
    for given in ([opt, ""], [f"{opt}="]):
        rc, out, _ = _in_process(capsys, [command, *path, *given, *rest, "--json"])
        payload = json.loads(out)
        assert rc == 2 and [f["code"] for f in payload["findings"]] == ["usage-error"], payload
        assert payload["error"] == f"{opt} is empty: it takes {payload['error'].rsplit(' ', 1)[-1]}"
        assert payload["findings"][0]["fix"].startswith(f"give {opt} ")
        rc, out, err = _in_process(capsys, [command, *path, *given, *rest])
        assert rc == 2 and out == "" and err.startswith(f"clef-format: {opt} is empty") and "Traceback" not in err
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("command,opt", [(c, o) for c, o in _value_options() if c in PATH_COMMANDS],
                         ids=[f"{c} {o}" for c, o in _value_options() if c in PATH_COMMANDS])
def test_a_report_of_arguments_that_did_not_parse_names_the_path_not_an_option_value(
        command: str, opt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``migrate --output out src --bogus``: the report named ``out`` (the first word not starting with
    ``-``) as PATH. Now an option's value is skipped, as argparse skips it, and PATH is ``src``; after
    ``--`` the next word is PATH."""
    for argv in ([command, opt, "value1", "my-ck", "--bogus"], [command, f"{opt}=value1", "my-ck", "--bogus"],
                 [command, opt, "value1", "--bogus", "--", "my-ck"]):
        rc, out, _ = _in_process(capsys, [*argv, "--json"])
        payload = json.loads(out)
        assert rc == 2 and payload["path"] == "my-ck", (argv, payload)


@pytest.mark.parametrize("argv", [["verify", "."], ["layers", "."], ["manifest", "."], ["migrate", "."],
                                  ["migrate", ".", "--current"], ["migrate", "rel/x", "--abort"], ["example", "new"],
                                  ["scan", "."], ["migrate", "{ck}", "--output", "out"], ["verify", "{ck}", "--python",
                                                                                         "./venv/bin/python"]])
def test_a_relative_path_from_a_working_folder_that_is_gone_is_one_refusal(argv: list[str], ck: Path,
                                                                           tmp_path: Path) -> None:
    """The shell's folder deleted, or replaced (``migrate .`` from inside the checkpoint does that): most
    commands died in a FileNotFoundError traceback, ``scan .`` found "no Clef copy" (exit 0). Now each is
    the same ``unreadable`` refusal, exit 2, naming the path and the fix; an absolute PATH still works."""
    gone = tmp_path / "gone"
    argv = [a.replace("{ck}", str(ck)) for a in argv]
    script = (f"import os, sys; os.mkdir({str(gone)!r}); os.chdir({str(gone)!r}); os.rmdir({str(gone)!r}); "
              "from clef_format.cli.main import main; sys.exit(main(sys.argv[1:]))")
    for as_json in (False, True):
        proc = subprocess.run([sys.executable, "-c", script, *argv, *(["--json"] if as_json else [])],
                              capture_output=True, text=True, env=ENV)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (proc.stdout, proc.stderr)
        relative = next(a for a in argv[1:] if not a.startswith("-") and not os.path.isabs(a))
        said = (f"{relative}: the current folder no longer exists (deleted, or replaced by a new folder at its "
                "path), so a relative path cannot be resolved")
        if as_json:
            (f,) = json.loads(proc.stdout)["findings"]
            assert (f["code"], f["message"]) == ("unreadable", said), f
            assert f["fix"] == 'cd "$PWD" to enter the folder now at that path, or give an absolute path'
        else:
            assert proc.stderr.startswith(f"clef-format: {said}\n  fix: cd "), proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["--bogus"], ["verify"], ["verify", "x", "--bogus"], ["migrate", "x", "--to", "nope"],
                                  ["scan", "--jobs", "0"], ["verify", "x", "--python"], ["layers", "x", "--vllm-version", "1"]])
def test_a_usage_error_is_said_once_with_one_prefix(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _in_process(capsys, argv)
    first = err.splitlines()[0]
    assert rc == 2 and out == "" and first.startswith("clef-format: ") and err.count("clef-format:") == 1, err
    rc, out, _ = _in_process(capsys, [*argv, "--json"])
    assert not json.loads(out)["error"].startswith("clef-format")


@pytest.mark.parametrize("argv", [["verify"], ["layers"], ["manifest"], ["migrate", "--to", "layout-2"],
                                  ["migrate", "--current"], ["scan"]])
def test_a_file_where_a_folder_is_expected_is_one_refusal(argv: list[str], ck: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Every command that takes a checkpoint (or a folder to search) refuses a file with the same
    ``read.paths.not_a_folder`` message and fix: what the path is, and the folder to give instead."""
    from clef_format.read.paths import not_a_folder

    stray = tmp_path / "notes.txt"
    stray.write_text("not a checkpoint\n")
    for path, folder in ((ck / "config.json", ck), (stray, tmp_path)):
        expected = not_a_folder(str(path))
        rc, out, _ = _in_process(capsys, [argv[0], str(path), *argv[1:], "--json"])
        (f,) = json.loads(out)["findings"]
        assert rc == 2 and (f["code"], f["message"], f["fix"]) == ("path-not-found", str(expected), expected.fix)
        assert f["message"] == f"{path} is a file, not a folder" and str(folder) in f["fix"]
    rc, _, err = _in_process(capsys, [argv[0], str(ck / "config.json"), *argv[1:]])
    assert rc == 2 and err == f"clef-format: {ck}/config.json is a file, not a folder\n" \
                              f"  fix: give the checkpoint's folder, {ck}, not a file in it\n"


@pytest.mark.parametrize("argv", [["verify"], ["layers"], ["manifest"], ["migrate", "--to", "layout-2"],
                                  ["migrate", "--current"], ["scan"]])
def test_a_path_that_names_nothing_has_a_fix(argv: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A mistyped PATH is one ``path-not-found`` whose fix says what to give instead, in text and JSON
    (it had no fix line for verify, layers, manifest and scan)."""
    gone = tmp_path / "no-such-checkpoint"
    rc, out, _ = _in_process(capsys, [argv[0], str(gone), *argv[1:], "--json"])
    (f,) = json.loads(out)["findings"]
    assert rc == 2 and f["code"] == "path-not-found" and str(gone) in f["message"]
    assert f["fix"] and ("folder" in f["fix"] or "directory" in f["fix"]), f
    rc, _, err = _in_process(capsys, [argv[0], str(gone), *argv[1:]])
    assert rc == 2 and f"  fix: {f['fix']}\n" in err, err


@pytest.mark.parametrize("flag", ["--abort", "--current"])
def test_migrate_without_path_names_the_flag_given(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``migrate --abort`` with no PATH: the fix keeps the user's flag (it said ``--to layout-2``, a run)."""
    rc, out, _ = _in_process(capsys, ["migrate", flag, "--json"])
    (f,) = json.loads(out)["findings"]
    assert rc == 2 and f["code"] == "usage-error" and f["fix"] == f"clef-format migrate PATH {flag}"


@pytest.mark.parametrize("argv", [["verify"], ["layers"], ["manifest"], ["migrate", "--to", "layout-2"],
                                  ["migrate", "--current"]])
def test_the_head_folder_of_a_checkpoint_is_refused_naming_the_checkpoint(argv: list[str], ck: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``verify ck/clef_head``: one refusal naming the checkpoint it belongs to (it was BROKEN for a missing
    backbone and config.json, with "download the checkpoint again" as the fix)."""
    from clef_format.spec.layouts import HEAD_DIR

    head = ck / HEAD_DIR
    rc, out, _ = _in_process(capsys, [argv[0], str(head), *argv[1:], "--json"])
    (f,) = json.loads(out)["findings"]
    assert rc == 2 and f["code"] == "path-not-found"
    assert f["message"] == f"{head} is the {HEAD_DIR} folder of the checkpoint {ck}, not a checkpoint"
    assert f["fix"] == f"give the checkpoint's folder, {ck}"
    followed = [argv[0], f["fix"].rsplit(", ", 1)[1], *argv[1:], *(["--dry-run"] if "--to" in argv else []), "--json"]
    rc, out, _ = _in_process(capsys, followed)  # the fix, followed, reads the checkpoint
    assert rc in (0, 1) and json.loads(out)["path"] == str(ck), out


@pytest.mark.parametrize("argv", [["verify"], ["layers"], ["manifest"], ["migrate", "--current"]])
def test_a_link_to_the_head_folder_or_a_file_in_it_names_the_checkpoint(argv: list[str], ck: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A symlink to ck/clef_head was read as a checkpoint: BROKEN, "download again", and ``manifest`` wrote
    its clef_manifest.json through the link into the checkpoint's head folder. A file inside clef_head/ was
    said to lie in clef_head, not in the checkpoint. Now both name the checkpoint, and nothing is written."""
    from clef_format.spec.layouts import HEAD_DIR

    link = tmp_path / "headlink"
    link.symlink_to(ck / HEAD_DIR)
    before = sorted(p.name for p in (ck / HEAD_DIR).iterdir())
    rc, out, _ = _in_process(capsys, [argv[0], str(link), *argv[1:], "--json"])
    (f,) = json.loads(out)["findings"]
    assert rc == 2 and f["message"] == f"{link} is the {HEAD_DIR} folder of the checkpoint {ck}, not a checkpoint"
    assert sorted(p.name for p in (ck / HEAD_DIR).iterdir()) == before
    inner = next(p for p in (ck / HEAD_DIR).iterdir() if p.suffix == ".json")
    rc, out, _ = _in_process(capsys, [argv[0], str(inner), *argv[1:], "--json"])
    (f,) = json.loads(out)["findings"]
    assert rc == 2 and f["fix"] == f"give the checkpoint's folder, {ck}, not a file in it", f


def test_a_link_to_a_checkpoint_file_names_the_checkpoint(ck: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """``verify ~/links/cfg`` where cfg leads to ck/config.json: the fix names ck, where the file really
    is (it named ~/links, which holds no checkpoint)."""
    link = tmp_path / "links" / "cfg"
    link.parent.mkdir()
    link.symlink_to(ck / "config.json")
    rc, out, _ = _in_process(capsys, ["verify", str(link), "--json"])
    (f,) = json.loads(out)["findings"]
    assert rc == 2 and f["fix"] == f"give the checkpoint's folder, {ck}, not a file in it"


def test_the_gate_refuses_a_file_as_verify_does(ck: Path) -> None:
    from clef_format.compat import check_checkpoint
    from clef_format.errors import PathNotFound
    from clef_format.read.paths import not_a_folder

    with pytest.raises(PathNotFound) as exc:
        check_checkpoint(str(ck / "config.json"), "0.1.4")
    assert str(exc.value) == str(not_a_folder(str(ck / "config.json")))


# ---- exit 2: exactly one finding with its code ----------------------------------------------------------

@pytest.mark.skipif(os.geteuid() == 0 and not SETPRIV, reason="root without setpriv reads every file")
@pytest.mark.parametrize("command", ["verify", "layers", "manifest", "migrate"])
def test_two_unreadable_files_are_one_finding(ck: Path, tmp_path: Path, command: str) -> None:
    root = tmp_path / "ck"
    shutil.copytree(ck, root)
    (root / "model.safetensors").chmod(0)
    (root / "config.json").chmod(0)
    try:
        for as_json in (True, False):
            proc = subprocess.run([*UNPRIVILEGED, *CLI, command, str(root), *(["--json"] if as_json else [])],
                                  capture_output=True, text=True, env=ENV, timeout=300)
            assert proc.returncode == 2, proc.stderr
            if as_json:
                payload = json.loads(proc.stdout)
                causes = [f for f in payload["findings"] if f["code"] in COULD_NOT_RUN]
                assert len(causes) == 1 and causes[0]["code"] == "unreadable", payload["findings"]
                assert "model.safetensors" in causes[0]["message"] and causes[0]["fix"], causes
                assert payload["error"] == causes[0]["message"]
    finally:
        (root / "model.safetensors").chmod(0o644)
        (root / "config.json").chmod(0o644)


# ---- the gate's arguments: what verify --plugin-version takes, Version objects, path types ---------------

VERSIONS = ["0.1.5", "0.2.0", "v0.2.0", " 0.2.0 ", "0.2.0rc1", "0.2.0.post1", "0.2", "1!0.2.0", "0.2.0+local",
            "banana", "", "0.2.x", "0.2.0 0.3.0"]


def _gate(source: object, version: object) -> str:
    from clef_format.compat import IncompatibleError, check_checkpoint

    try:
        check_checkpoint(source, version)  # type: ignore[arg-type]
        return "served"
    except IncompatibleError as exc:
        return exc.code
    except UsageError:
        return "usage-error"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_gate_takes_what_verify_plugin_version_takes(built, version: str) -> None:
    root = built("layout-2", "bf16", num_layers=4)
    proc = subprocess.run([*CLI, "verify", str(root), "--plugin-version", version, "--json"], capture_output=True,
                          text=True, env=ENV, timeout=300)
    payload = json.loads(proc.stdout)
    gate = _gate(root, version)
    if proc.returncode == 2:
        assert payload["findings"][0]["code"] == "usage-error" and gate == "usage-error", (version, gate)
    else:
        errors = {f["code"] for f in payload["findings"] if f["severity"] == "error"}
        assert gate != "usage-error" and (gate == "served") == (not errors), (version, gate, errors)
        assert _gate(root, Version(version)) == gate  # the same version as a packaging Version


class _BytesPath:
    def __init__(self, path: Path) -> None:
        self._path = os.fsencode(path)

    def __fspath__(self) -> bytes:
        return self._path


@pytest.mark.parametrize("hook", ["check_checkpoint", "head_config", "backbone_weights"])
def test_every_hook_takes_path_types_and_version_objects(built, hook: str) -> None:
    from clef_format.vllm.gate import check_checkpoint
    from clef_format.vllm.head import head_config

    fn = {"check_checkpoint": check_checkpoint, "head_config": head_config}.get(hook)
    if fn is None:
        pytest.importorskip("torch")
        from clef_format.vllm.weights import backbone_weights as fn
    root = built("layout-2", "bf16", num_layers=4)
    for source in (str(root), root, os.fsencode(root), _BytesPath(root)):
        for version in ("0.2.1", Version("0.2.1")):
            fn(source, version)
    with pytest.raises(Exception) as refused:
        fn(os.fsencode(root), Version("0.1.5"))  # a refusal of the pair, not of the arguments' types
    assert type(refused.value).__name__ == "IncompatibleError"


@pytest.mark.parametrize("source,version", [(3, "0.2.1"), (None, "0.2.1"), (["ck"], "0.2.1"), ("CK", 5),
                                            ("CK", None), ("CK", b"0.2.1"), ("CK", "banana"), ("CK", 0.2)])
@pytest.mark.parametrize("hook", ["check_checkpoint", "head_config"])
def test_any_other_argument_is_a_usage_error_with_a_fix(built, source: object, version: object, hook: str) -> None:
    from clef_format.vllm.gate import check_checkpoint
    from clef_format.vllm.head import head_config

    fn = {"check_checkpoint": check_checkpoint, "head_config": head_config}[hook]
    root = built("layout-2", "bf16", num_layers=4)
    with pytest.raises(UsageError) as exc:
        fn(str(root) if source == "CK" else source, version)  # type: ignore[arg-type]
    assert exc.value.code == "usage-error" and str(exc.value) and exc.value.fix
