"""What the text reports say (cli/render.py), held against the JSON of the same command, the files on disk
and the tables' own metadata: the per-layer table of ``layers`` and its memory line, the files ``example``
built, the int8 table quality a migration prints, and the escapes of names that hold control characters."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable

import pytest

from clef_format.cli.render import human_size, printable
from clef_format.fixtures.configs import full_config
from clef_format.fixtures.quant import build_quant_config
from clef_format.spec import layouts as L


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``clef-format ARGV`` through the real entry point, in-process: the exit status and stdout."""
    from clef_format.cli.main import main

    capsys.readouterr()
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = int(exc.code or 0)
    return rc, capsys.readouterr().out


def _table(view: dict[str, Any]) -> list[str]:
    """The per-layer table as the JSON view gives it: one line per layer (index, attention, then each
    projection group as name=scheme, comma-separated), the other modules, the memory line."""
    lines = [f"{view['arch']}: {len(view['rows'])} decoder layers"]
    for r in view["rows"]:
        lines.append(f"  {r['index']:3d} {r['attention']:17s} " + ", ".join(f"{k}={v}" for k, v in r["groups"].items()))
    lines += [f"  {k}: {v}" for k, v in view["other"].items()]
    verdict = "fits" if view["fits_16gb"] else "does NOT fit"
    lines.append(f"weights in vLLM: {view['weight_bytes'] / 2**30:.2f} GiB; {verdict} a 16 GB card once 3.6 GiB are "
                 "reserved for context, activations and KV cache")
    return lines


@pytest.mark.parametrize(("build", "fits"), [(None, False), ("w4a16", True)])
def test_layers_text_of_a_config_only_folder_is_its_findings_then_the_json_view(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], build: str | None, fits: bool) -> None:
    """A 9B config.json alone (no weights: an error): the report first, under the ``layers`` title, then the
    rules' vLLM version and the table, blocks apart by one empty line. BF16 weights (17.5 GiB) do not fit a
    16 GB card; W4A16 ones (8.3 GiB) do."""
    cfg = full_config()
    if build is not None:
        cfg["quantization_config"] = build_quant_config(build, 32)
    root = tmp_path / "ck"
    root.mkdir()
    (root / L.CONFIG).write_text(json.dumps(cfg))
    rc, text = _run(capsys, "layers", str(root))
    _, out = _run(capsys, "layers", str(root), "--json")
    view = json.loads(out)
    assert rc == 1 and view["fits_16gb"] is fits and [f["code"] for f in view["findings"]] == ["missing-file"], view
    assert 8 * 2**30 < view["weight_bytes"] < (9 if fits else 18) * 2**30, view["weight_bytes"]
    head, rules, table = text.rstrip("\n").split("\n\n")[-3:]
    assert text.startswith(f"layers {root}\n  layout   unknown\n  result   BROKEN  (1 error(s), 0 warning(s))\n\n"), text
    assert "missing-file" in head and rules == f"vLLM {view['vllm_version']} rules"
    assert table.split("\n") == _table(view)
    assert ("does NOT fit a 16 GB card" in text) is not fits and (" fits a 16 GB card" in text) is fits


def test_layers_text_of_a_checkpoint_without_findings_is_the_rules_and_the_table_alone(
        built: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    root = built("layout-2", "hybrid")
    rc, text = _run(capsys, "layers", str(root))
    _, out = _run(capsys, "layers", str(root), "--json")
    view = json.loads(out)
    assert rc == 0 and view["findings"] == [] and view["fits_16gb"] is True, view
    assert text == f"vLLM {view['vllm_version']} rules\n\n" + "\n".join(_table(view)) + "\n"


def test_layers_text_without_a_view_is_the_report_under_the_layers_title(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, text = _run(capsys, "layers", str(tmp_path))
    assert rc == 1 and text.startswith(f"layers {tmp_path}\n  layout   unknown\n"), text
    assert "config.json is missing" in text and "decoder layers" not in text and "rules" not in text


def test_example_text_lists_the_files_it_built_with_their_sizes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``example``'s report is verify's of the folder it built: every file counted, the .json and
    .safetensors ones listed with their size on disk."""
    out = tmp_path / "ex"
    rc, text = _run(capsys, "example", str(out))
    files = {p.relative_to(out).as_posix(): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}
    listed = {rel: size for rel, size in files.items() if rel.endswith((".json", ".safetensors"))}
    assert rc == 0 and listed and len(listed) < len(files), files
    lines = text.split("\n")
    first = lines.index(f"  files    {len(files)} ({human_size(sum(files.values()))}), "
                        f"{len(files) - len(listed)} small file(s) not listed")
    assert lines[first + 1:first + 1 + len(listed)] == [f"           {rel}  {human_size(n)}" for rel, n in listed.items()]


def test_migrate_text_prints_each_tables_quality_as_the_tables_file_records_it(
        fresh: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The relative errors in percent (the quantizer keeps them between 0.5% and 2%), the cosines as they are."""
    root = fresh("layout-1")
    rc, text = _run(capsys, "migrate", str(root))
    from clef_format.read.safetensors import read_header

    quality = json.loads(read_header(root / L.TABLES).metadata["quality"])
    assert rc == 0 and set(quality) == set(L.TABLE_NAMES), text
    shown = {}
    for line in text.split("\n"):
        m = re.fullmatch(r"  (\S+): relative error ([\d.]+)%, mean row cosine ([\d.]+), worst row cosine ([\d.]+), "
                         r"worst row relative error ([\d.]+)%", line)
        if m:
            shown[m[1]] = tuple(float(x) for x in m.groups()[1:])
    assert list(shown) == sorted(quality), text
    for table, q in quality.items():
        rel, mean_cos, min_cos, worst_rel = shown[table]
        assert 0.5 < rel < 2 and rel <= worst_rel < 5, (table, shown[table])
        assert rel == round(q["rel_error"] * 100, 3) and worst_rel == round(q["max_row_rel_error"] * 100, 3)
        assert mean_cos == round(q["mean_row_cosine"], 7) and min_cos == round(q["min_row_cosine"], 7)


def test_printable_escapes_control_characters_as_python_writes_them_and_keeps_the_rest() -> None:
    name = "org/a\nb\tc\x1b[2Jd\\e f\u00e9\x7f"
    assert printable(name) == "org/a\\nb\\tc\\x1b[2Jd\\e f\u00e9\\x7f"
    assert printable("C:\\models\\clef") == "C:\\models\\clef"
    assert "\n" not in printable(os.linesep.join(["one", "two"]))


def test_scan_text_names_each_copy_as_the_json_row_does(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """WHERE: a cached revision is ``org/name@`` its commit's first 12 digits, then its refs (comma-separated,
    in brackets) if any ref points to it; a folder, and a cached repo whose snapshots cannot be listed, are
    their paths. A JSON row holds the same repo, revision and refs."""
    from huggingface_hub import constants

    from clef_format.fixtures.builders import build_checkpoint
    from tests.support.hub_cache import build_hub_cache, fake_commit

    cache, folders = tmp_path / "hub", tmp_path / "models"
    current, older = fake_commit("clef-a@main"), fake_commit("clef-a@old")
    build_hub_cache(cache, "org/clef-a", build_checkpoint(tmp_path / "src-2", "layout-2"), revision="main", commit=current)
    (cache / "models--org--clef-a" / "refs" / "v2").write_text(current)
    build_hub_cache(cache, "org/clef-a", build_checkpoint(tmp_path / "src-1", "layout-1"), revision="old", commit=older)
    (cache / "models--org--clef-a" / "refs" / "old").unlink()  # an older download no ref points to any more
    (cache / "models--org--clef-b").mkdir()
    (cache / "models--org--clef-b" / "snapshots").write_text("not a folder")
    unlisted = str(cache / "models--org--clef-b" / "snapshots")
    build_checkpoint(folders / "clef-copy", "layout-2")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # the configured cache: scan with no ROOT

    for roots, expected in [
        ((), {("org/clef-a", current, ("main", "v2")): f"org/clef-a@{current[:12]} (main, v2)",
              ("org/clef-a", older, ()): f"org/clef-a@{older[:12]}", ("org/clef-b", None, ()): unlisted}),
        ((str(folders),), {(None, None, ()): str(folders / "clef-copy")}),
    ]:
        _, text = _run(capsys, "scan", *roots)
        _, out = _run(capsys, "scan", *roots, "--json")
        rows = json.loads(out)["rows"]
        assert {(r["repo_id"], r["revision"], tuple(r["refs"])) for r in rows} == set(expected), out
        assert all(r["where"] == unlisted for r in rows if r["repo_id"] == "org/clef-b"), out
        lines = text.split("\n")
        assert lines[0].startswith("WHERE ") and len(current) == 40
        for cell in expected.values():
            assert sum(1 for line in lines[1:] if line.startswith(cell + "  ")) == 1, (cell, text)


def test_history_text_is_one_line_per_step_after_the_base(capsys: pytest.CaptureFixture[str]) -> None:
    """``migrate --history``: the base layout, then each step's revision (padded to 20), its layouts joined by
    ``<->`` when it can be undone and `` ->`` when it cannot (the marker repair), its down_revision and its
    description, each read from the step module itself."""
    import importlib

    steps = [importlib.import_module(f"clef_format.migrations.{name}") for name in ("v0001_int8_tables", "v0002_repair_marker")]
    rc, text = _run(capsys, "migrate", "--history")
    expected = ["base = layout-1 (BF16 tables in the backbone)"]
    for s, arrow in zip(steps, ("<->", " ->")):
        expected.append(f"{s.revision.ljust(20)} {s.from_layout} {arrow} {s.to_layout}   (down_revision {s.down_revision}): "
                        f"{s.description}")
    assert rc == 0 and text == "\n".join(expected) + "\n", text
    assert getattr(steps[1], "repair", False) and not getattr(steps[0], "repair", False)
