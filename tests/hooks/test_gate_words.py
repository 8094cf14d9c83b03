"""What the gate says, word for word, where an operator reads it: the refusal's summary of the other
errors, a marker that is no specifier, an argument that is no checkpoint, a bytes path (survivors of
the hooks' unsampled mutmut run)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from clef_format.errors import IncompatibleError, UsageError
from clef_format.spec import layouts as L
from clef_format.spec.findings import error
from clef_format.vllm import check_checkpoint
from clef_format.vllm.gate import MORE_FILES, _more

NEW = "0.2.1"


def test_the_summary_of_the_other_errors_names_each_code_with_its_files() -> None:
    files = [f"model-{i:05d}.safetensors" for i in range(MORE_FILES + 3)]
    errors = [error("bad-header", "first", file="a.json")]
    errors += [error("hash-mismatch", "x", file=f) for f in files]
    errors += [error("hash-mismatch", "again", file=files[0]), error("tensor-shape", "no file"),
               error("bad-config", "y", file="b.json"), error("bad-config", "z", file="c.json")]
    shown = ", ".join(files[:MORE_FILES])
    assert _more(errors) == (f" (and {len(errors) - 1} more: bad-config [b.json, c.json]; hash-mismatch [{shown} "
                             f"and 3 more]; tensor-shape)")
    assert _more(errors[:1]) == "" and _more([]) == ""
    assert _more(errors[:2]) == f" (and 1 more: hash-mismatch [{files[0]}])"
    exactly = [errors[0]] + [error("hash-mismatch", "x", file=f) for f in files[:MORE_FILES]]
    assert _more(exactly).endswith(f"hash-mismatch [{', '.join(files[:MORE_FILES])}])")


def test_a_marker_that_is_no_specifier_is_refused_with_the_fix_that_sets_one(fresh: Any) -> None:
    root = fresh("layout-2", "bf16")
    cfg = json.loads((root / L.HEAD_CONFIG).read_text())
    cfg[L.MARKER_KEY] = "not a specifier"
    (root / L.HEAD_CONFIG).write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, NEW)
    assert (exc.value.code, exc.value.reason, exc.value.fix) == (
        "marker-invalid",
        "requires_clef_vllm = 'not a specifier' is not a PEP 440 specifier: Invalid specifier: 'not a specifier'",
        f'set "requires_clef_vllm": ">=0.2.0" in {L.HEAD_CONFIG}')


@pytest.mark.parametrize("source", [42, ["ck"], None])
def test_an_argument_that_is_no_checkpoint_is_a_usage_error_saying_what_to_pass(source: Any) -> None:
    with pytest.raises(UsageError) as exc:
        check_checkpoint(source, NEW)
    assert str(exc.value).startswith(f"checkpoint {source!r} ({type(source).__name__}) is not a path")
    assert exc.value.fix == ("pass the checkpoint directory (str, bytes or os.PathLike), a cached repo id, "
                             "or a Checkpoint")


def test_a_bytes_path_is_read_as_its_str(built: Any) -> None:
    root = built("layout-2", "bf16")
    ck = check_checkpoint(os.fsencode(root), NEW)
    assert isinstance(ck.name, str) and ck.name == str(root)


def test_only_reading_errors_refuse_first_and_they_come_with_the_refusal(fresh: Any) -> None:
    """A file the checkpoint links outside itself (path-escape, a reading error) and a wrong marker: the
    reading error is refused first, with every reading error behind it and none of the others."""
    root = fresh("layout-2", "bf16")
    outside = root.parent / "outside.json"
    (root / "generation_config.json").rename(outside)
    (root / "generation_config.json").symlink_to(outside)
    cfg = json.loads((root / L.HEAD_CONFIG).read_text())
    cfg[L.MARKER_KEY] = ">=9"
    (root / L.HEAD_CONFIG).write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, NEW)
    assert exc.value.code == "path-escape" and exc.value.fix
    assert exc.value.findings and {f.code for f in exc.value.findings} == {"path-escape"}
    assert not any(f.severity != "error" for f in exc.value.findings)
