"""What a person sees, per command: every finding the fixtures produce, in text and in JSON.

The broken states come from their generators (``tests.support.broken.BROKEN`` and the hostile
corpus ``tests.support.hostile_cases.CASES``), so a state added there is checked here too. For each
finding of each command the JSON carries its message and, for errors and warnings, its fix; the text
output shows the code, the message and the fix line, warnings included (a layout-1 download keeps its
``migrate ... --to layout-2`` line). ``verify --layers`` keeps the per-layer view when there are errors.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clef_format.cli.main import main
from tests.support.broken import BROKEN, build_broken
from tests.support.hostile_cases import CASES, fresh_copy


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(list(argv))
    return rc, capsys.readouterr().out


def _text_and_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, dict]:
    """The same command in text and in JSON: same exit status, and each finding shown in both."""
    rc_text, text = _run(capsys, *argv)
    rc_json, out = _run(capsys, *argv, "--json")
    payload = json.loads(out)
    assert rc_text == rc_json, (argv, rc_text, rc_json)
    for f in payload["findings"]:
        assert f["message"], f
        if f["severity"] in ("error", "warning"):
            assert f.get("fix"), f"{argv}: {f['code']} ({f['severity']}) has no fix in JSON"
        block = f"\n        {f['message']}" + (f"\n        fix: {f['fix']}" if f.get("fix") else "")
        assert f["code"] in text, (argv, f["code"])
        assert block in text, f"{argv}: the text output lacks the message/fix of {f['code']}:\n{block}\n--- text:\n{text}"
    return rc_json, text, payload


def _layers_kept(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    """Wherever ``layers`` can give the per-layer view, ``verify --layers`` gives it, errors or not."""
    _, out = _run(capsys, "layers", str(root), "--json")
    layers = json.loads(out)
    if "rows" not in layers:
        return
    rc, text, payload = _text_and_json(capsys, "verify", str(root), "--layers")
    view = payload.get("layers")
    assert view is not None, "verify --layers dropped the per-layer view"
    assert (view["arch"], view["rows"], view["other"]) == (layers["arch"], layers["rows"], layers["other"])
    assert f"{view['arch']}: {len(view['rows'])} decoder layers" in text, text


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_state_in_text_and_json_per_command(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = build_broken(tmp_path / "ck", name)
    rc, _, payload = _text_and_json(capsys, "verify", str(root))
    assert {f["code"] for f in payload["findings"]} >= set(BROKEN[name].codes)
    _layers_kept(capsys, root)
    _text_and_json(capsys, "layers", str(root))
    _text_and_json(capsys, "migrate", str(root), "--dry-run")
    _text_and_json(capsys, "migrate", str(root), "--dry-run", "--output", str(tmp_path / "out"))
    _text_and_json(capsys, "migrate", str(root), "--current")


def test_the_broken_states_include_errors_with_a_layers_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The --layers check above is not vacuous: some broken states have errors and a per-layer view."""
    root = build_broken(tmp_path / "ck", "norm-shape")
    rc, _, payload = _text_and_json(capsys, "verify", str(root), "--layers")
    assert rc == 1 and not payload["ok"] and payload.get("layers"), payload


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_case_in_text_and_json(case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = fresh_copy(tmp_path / "ck")
    case.build(root)
    capsys.readouterr()
    _, _, payload = _text_and_json(capsys, "verify", str(root), *(["--deep"] if case.deep else []))
    assert case.code in {f["code"] for f in payload["findings"]}


def test_a_layout_1_download_keeps_its_migrate_line(built, capsys: pytest.CaptureFixture[str]) -> None:
    """The warning a layout-1 download gets names the command that upgrades it, in text as in JSON."""
    root = built("layout-1")
    rc, text, payload = _text_and_json(capsys, "verify", str(root))
    assert rc == 0 and [f["code"] for f in payload["findings"]] == ["legacy-layout"]
    assert f"fix: clef-format migrate {root} --to layout-2" in text


# ---- every option in both spellings and in every position ---------------------------------------------

#: (command, option) -> (a valid value, the other arguments the command needs besides PATH). Every option
#: that takes a value must be here (test_every_value_option_is_spelled_both_ways fails on a new one).
VALUES: dict[tuple[str, str], tuple[str, list[str]]] = {
    ("verify", "--plugin-version"): ("0.2.0", []),
    ("verify", "--vllm-version"): ("0.33", ["--layers"]),
    ("layers", "--vllm-version"): ("0.33", []),
    ("migrate", "--to"): ("layout-1", ["--dry-run"]),
    ("migrate", "--output"): ("{tmp}/out", ["--dry-run"]),
    ("example", "--layout"): ("layout-1", []),
    ("example", "--build"): ("fp8", []),
}


#: Options whose value changes nothing this test can compare on one checkpoint, each with where it is tested.
SPELLED_ELSEWHERE: dict[tuple[str, str], str] = {
    ("verify", "--python"): "this interpreter is the default environment: tests/verify/test_plugins.py uses a real venv",
    ("scan", "--jobs"): "only how many processes verify the copies: the same rows by design (tests/verify/test_scan.py)",
    ("scan", "--into"): "only where --fixable's commands write: tests/verify/test_scan.py runs them",
}


def _value_options() -> set[tuple[str, str]]:
    from clef_format.cli.parser import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return {(name, opt) for name, p in sub.choices.items() for a in p._actions if a.option_strings and a.nargs != 0
            for opt in a.option_strings if opt.startswith("--") and a.dest != "help"}


def _stable(payload: dict) -> str:
    """The JSON text without what changes between two runs by itself (the free space on the disk)."""
    import re

    return re.sub(r'"space_free": \d+', '"space_free": N', json.dumps(payload, sort_keys=True))


def test_every_value_option_is_spelled_both_ways() -> None:
    assert _value_options() == set(VALUES) | set(SPELLED_ELSEWHERE)


def _spellings(path: str, opt: str, value: str, rest: list[str]) -> list[list[str]]:
    """``--x V`` and ``--x=V``, before PATH, after it, and after the other options; --json first and last."""
    out = []
    for given in ([opt, value], [f"{opt}={value}"]):
        out += [[path, *given, *rest, "--json"], [*given, path, *rest, "--json"], ["--json", *rest, *given, path],
                [*rest, path, "--json", *given]]
    return out


@pytest.mark.parametrize("command,opt", sorted(VALUES), ids=[f"{c} {o}" for c, o in sorted(VALUES)])
def test_an_option_means_the_same_however_it_is_spelled(command: str, opt: str, built, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    value, rest = VALUES[(command, opt)]
    value = value.format(tmp=tmp_path)
    results = []
    for i, argv in enumerate(_spellings("{path}", opt, value, rest)):
        path = str(tmp_path / f"new{i}") if command == "example" else str(built("layout-1"))
        rc, out = _run(capsys, command, *[a.replace("{path}", path) for a in argv])
        payload = json.loads(out)
        assert rc in (0, 1), (argv, payload["findings"])
        results.append((rc, _stable(payload).replace(path, "PATH")))
    assert len(set(results)) == 1, [argv for argv in _spellings("PATH", opt, value, rest)]
    default = str(tmp_path / "default") if command == "example" else str(built("layout-1"))
    _, out = _run(capsys, command, default, *rest, "--json")
    assert _stable(json.loads(out)).replace(default, "PATH") != results[0][1], \
        "the option changed nothing: the test would not see it ignored"


def test_a_migrate_dry_run_into_output_names_it_however_spelled(built, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    src, out = built("layout-1"), tmp_path / "out"
    for argv in (["--output", str(out)], [f"--output={out}"]):
        rc, text = _run(capsys, "migrate", str(src), *argv, "--dry-run")
        assert rc == 0 and not out.exists()
        assert "=" + str(out) not in text and f"--output={out}" not in text, text


# ---- containment: the output inside the source, the source inside the output ----------------------------

def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b"<dir>") for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("spelled", ["space", "equals"])
@pytest.mark.parametrize("where", ["output-inside-source", "output-is-source", "source-inside-output",
                                   "source-inside-output-via-dotdot"])
def test_migrate_refuses_source_and_output_containing_each_other(fresh, tmp_path: Path, where: str, spelled: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing is written, both ways round: a result inside the source would be carried into itself,
    a source inside the result would be overwritten by it."""
    ck = fresh("layout-1")
    if where.startswith("source-inside-output"):
        (tmp_path / "outer").mkdir()
        src = ck.rename(tmp_path / "outer" / "src")
        out = Path(f"{src}/..") if where.endswith("dotdot") else src.parent
    else:
        src = ck
        out = ck / "sub" if where == "output-inside-source" else Path(f"{ck}/")
    before_src, before_parent = _tree(src), _tree(src.parent)
    option = ["--output", str(out)] if spelled == "space" else [f"--output={out}"]
    for argv in (["migrate", str(src), *option, "--to", "layout-2"], ["migrate", *option, str(src), "--to", "layout-2"]):
        rc_text, text = _run(capsys, *argv)
        rc, out_json = _run(capsys, *argv, "--json")
        payload = json.loads(out_json)
        assert rc_text == rc and rc in (1, 2), (argv, payload)
        assert len(payload["findings"]) == 1 and payload["findings"][0]["fix"], payload
        assert _tree(src) == before_src and _tree(src.parent) == before_parent



# ---- Ctrl-C: the advice names the output as a command line takes it -----------------------------------

def _sigint_as_from_a_shell() -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a background runner may have it ignored


@pytest.mark.parametrize("phase", ["lock:1", "stage:1"])
def test_ctrl_c_advice_is_the_same_for_every_spelling_of_output(fresh, tmp_path: Path, phase: str) -> None:
    """``--output DIR``, ``--output=DIR``, before or after PATH: one advice, naming DIR (never ``=DIR``)."""
    import os
    import subprocess
    import sys

    src = fresh("layout-1")
    fixes, texts = set(), []
    for i, option in enumerate((["--output", "{out}"], ["--output={out}"])):
        for before in (False, True):
            out = tmp_path / f"out{i}{int(before)}"
            opt = [o.format(out=out) for o in option]
            argv = [*opt, str(src)] if before else [str(src), *opt]
            for as_json in (True, False):
                proc = subprocess.run([sys.executable, "-m", "clef_format", "migrate", *argv, "--to", "layout-2",
                                       *(["--json"] if as_json else [])], capture_output=True, text=True,
                                      env={**os.environ, "CLEF_FORMAT_CRASH_AT": f"{phase}:INT"},
                                      preexec_fn=_sigint_as_from_a_shell)
                assert proc.returncode == 2, proc.stderr
                if as_json:
                    fix = json.loads(proc.stdout)["findings"][0]["fix"]
                    assert "=" + str(out) not in fix and f"--output={out}" not in fix, fix
                    fixes.add(fix.replace(str(out), "OUT"))
                else:
                    texts.append(proc.stderr)
                    assert "=" + str(out) not in proc.stderr, proc.stderr
                    assert "fix: " in proc.stderr
                import shutil

                shutil.rmtree(out, ignore_errors=True)
                for p in tmp_path.iterdir():  # what the run left beside its output: the next spelling starts afresh
                    if p.name.startswith(f".{out.name}") or p.name.startswith(f"{out.name}."):
                        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink()
    assert len(fixes) == 1, fixes
