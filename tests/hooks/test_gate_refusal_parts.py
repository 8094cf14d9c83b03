"""The gate's refusal as a plugin author reads it: a warning met while reading never refuses, a reading
refusal carries the finding's own fix, and a pair refusal met together with an edited file keeps its
reason and fix among the findings behind the refusal (survivors of the hooks' unsampled mutmut run)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from clef_format.errors import IncompatibleError
from clef_format.read.checkpoint import open_checkpoint
from clef_format.spec import layouts as L
from clef_format.vllm import check_checkpoint

NEW = "0.2.1"


def test_a_warning_while_reading_never_refuses(fresh: Any) -> None:
    """A key written twice with the same value in config.json is a bad-config *warning* (a reading code):
    json keeps the last value, transformers and vLLM load it; the gate serves it."""
    root = fresh("layout-2", "bf16")
    text = (root / L.CONFIG).read_text()
    (root / L.CONFIG).write_text(text.replace("{", '{"model_type": "qwen3_5", ', 1))
    ck = open_checkpoint(str(root))
    assert [(f.code, f.severity) for f in ck.findings if f.code == "bad-config"] == [("bad-config", "warning")]
    assert check_checkpoint(str(root), NEW, check_references=False).root == ck.root


def test_a_reading_refusal_carries_the_finding_s_own_fix(fresh: Any) -> None:
    """A FIFO where tokenizer.json should be: never opened (it would block the engine), refused first, with the
    reading finding's own fix (replace the file), not a generic one."""
    root = fresh("layout-2", "bf16")
    os.unlink(root / "tokenizer.json")
    os.mkfifo(root / "tokenizer.json")
    (reading,) = [f for f in open_checkpoint(str(root)).findings if f.severity == "error"]
    assert reading.code == "special-file"
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(str(root), NEW, check_references=False)
    assert (exc.value.code, exc.value.fix) == (reading.code, reading.fix) and "tokenizer.json" in reading.fix


def test_only_reading_errors_refuse_before_the_checks(fresh: Any) -> None:
    """A truncated tables file is an error met while reading but no reading refusal: the gate goes on to the
    content check, which names the file that is not the download's first (hash-mismatch), as verify does."""
    from clef_format.cli.main import main

    root = fresh("layout-2", "bf16")
    assert main(["manifest", str(root), "--json"]) == 0
    with open(root / L.TABLES, "r+b") as fh:
        fh.truncate(40)
    assert [f.code for f in open_checkpoint(str(root)).findings if f.severity == "error"] == ["bad-header"]
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(str(root), NEW, check_references=True)
    assert exc.value.code == "hash-mismatch"


def test_a_pair_refusal_beside_an_edited_file_keeps_its_reason_and_fix(fresh: Any) -> None:
    """A layout-1 download (plugin 0.2.1 cannot serve it) whose config.json was edited after download: the
    edited file comes first, and the pair's own refusal stays among the findings, with its words and fix."""
    from clef_format.cli.main import main

    root = fresh("layout-1", "bf16")
    assert main(["manifest", str(root), "--json"]) == 0  # the download's reference: clef_manifest.json
    with pytest.raises(IncompatibleError) as alone:
        check_checkpoint(str(root), NEW, check_references=False)
    cfg = json.loads((root / L.CONFIG).read_text())
    cfg["text_config"]["rms_norm_eps"] = 2e-06
    (root / L.CONFIG).write_text(json.dumps(cfg))
    with pytest.raises(IncompatibleError) as both:
        check_checkpoint(str(root), NEW, check_references=True)
    assert both.value.code == "hash-mismatch"
    pair = [f for f in both.value.findings if f.code == alone.value.code]
    assert pair and (pair[0].message, pair[0].fix) == (alone.value.reason, alone.value.fix) and pair[0].fix
