"""The config.json check (verify/checks/config.py): the tied-tables rule applies where the checkpoint
stores both tables (every known layout, or a folder of no layout whose backbone holds them), and a
config that did not parse into a model is left to the reader's bad-config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.verify.checks.config import check_config

TIED = {"code": "config-invalid", "severity": "error",
        "message": "tie_word_embeddings is true, but this checkpoint stores embed_tokens and lm_head as two tables "
                   "(Clef's lm_head is untied): transformers ties lm_head to embed_tokens and drops the stored lm_head",
        "file": L.CONFIG, "fix": 'set "tie_word_embeddings": false in config.json'}


def _tie(root: Path) -> None:
    config = json.loads((root / L.CONFIG).read_text())
    config["tie_word_embeddings"] = True
    (root / L.CONFIG).write_text(json.dumps(config))


def test_tied_tables_are_refused_where_a_folder_of_no_layout_holds_both_in_its_backbone(fresh) -> None:
    """layout-1 without its joint head: no layout, but the backbone still stores the two BF16 tables."""
    root = fresh("layout-1", "bf16")
    shutil.rmtree(root / "clef_head")
    _tie(root)
    ck = read_checkpoint(root)
    assert ck.layout is L.Layout.UNKNOWN and all(t in ck.backbone for t in ck.tables)
    assert [f.to_dict() for f in check_config(ck)] == [TIED]


def test_tied_tables_are_not_refused_where_a_folder_of_no_layout_stores_no_table(fresh) -> None:
    """layout-2 without clef_head/: no layout, and neither table is stored anywhere; tying is then no loss."""
    root = fresh("layout-2", "bf16")
    shutil.rmtree(root / "clef_head")
    _tie(root)
    ck = read_checkpoint(root)
    assert ck.layout is L.Layout.UNKNOWN and not any(t in ck.backbone for t in ck.tables)
    assert list(check_config(ck)) == []


def test_tied_tables_are_refused_in_a_known_layout(fresh) -> None:
    root = fresh("layout-2", "bf16")
    _tie(root)
    assert [f.to_dict() for f in check_config(read_checkpoint(root))] == [TIED]


def test_a_config_that_parses_into_no_model_is_left_to_the_reader(fresh) -> None:
    root = fresh("layout-2", "bf16")
    config = json.loads((root / L.CONFIG).read_text())
    del config["text_config"]["hidden_size"]
    (root / L.CONFIG).write_text(json.dumps(config))
    ck = read_checkpoint(root)
    assert ck.config is not None and ck.model is None and "bad-config" in {f.code for f in ck.findings}
    assert list(check_config(ck)) == []
