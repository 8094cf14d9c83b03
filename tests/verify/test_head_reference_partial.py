"""A reference file the static reader follows only in part: what it could not follow decides nothing.

Each head here is valid: torch builds exactly the file written (torch is the oracle, on the meta
device). The reader stops partway (a statement it does not evaluate, after which the file may replace
or delete what it built), or leaves one subtree unknown; neither may turn into an error, and neither
may let the config check overrule layers the reference did decide. Where the reference did decide a
layer, a mutation of that layer is still an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clef_format.fixtures.tensors import Tensor, save_file
from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.spec.marker import without_marker
from clef_format.verify.run import verify_checkpoint

torch = pytest.importorskip("torch")

HEAD = ("import torch\nimport torch.nn as nn\n\n\nclass JointSchemaHead(nn.Module):\n"
        "    def __init__(self, hidden_size, width, routing_layers, layers, heads, feedforward):\n"
        "        super().__init__()\n")
LAYERS_2FF = ("        self.layers = nn.ModuleList([nn.TransformerDecoderLayer(width, heads, 2 * feedforward, "
              "batch_first=True) for _ in range(layers)])\n")
BODIES = {
    "stops-then-drops-a-bias": "        self.proj = nn.Linear(hidden_size, width)\n        self.proj.bias = None\n",
    "stops-at-del-then-inserts": ("        self.extra = nn.ModuleList([nn.Linear(width, width) for _ in range(layers)])\n"
                                  "        del self.extra[0]\n        self.extra.insert(0, nn.Linear(width, 2 * width))\n"),
    "stops-at-while-then-replaces": ("        self.a = nn.Linear(width, width)\n        n = 0\n        while n < 1:\n"
                                     "            n += 1\n        self.a = nn.Linear(width, 3 * width)\n"),
    "unknown-dict-and-2ff-layers": "        self.norms = nn.ModuleDict({k: nn.LayerNorm(width) for k in ['a']})\n" + LAYERS_2FF,
    "unknown-dict-and-linear-evidence": ("        self.norms = nn.ModuleDict({k: nn.LayerNorm(width) for k in ['a']})\n"
                                         "        self.evidence_layers = nn.ModuleList([nn.Linear(width, width) "
                                         "for _ in range(routing_layers)])\n"),
}


def _valid_head(fresh, body: str, tmp_path: Path, code: str | None = None) -> tuple[Path, dict[str, tuple[int, ...]]]:
    """The checkpoint with this reference file (``HEAD + body``, or ``code``) and the head torch builds
    from it, written as BF16."""
    root = fresh("layout-2", "bf16")
    code = code if code is not None else HEAD + body
    (root / L.HEAD_CODE).write_text(code)
    config = without_marker(json.loads((root / L.HEAD_CONFIG).read_text()))
    namespace: dict = {"__name__": "reference"}
    exec(compile(code, str(tmp_path / "reference.py"), "exec"), namespace)  # the test's own oracle, never the tool
    with torch.device("meta"):
        head = namespace["JointSchemaHead"](**config)
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    _write(root, shapes)
    return root, shapes


def _write(root: Path, shapes: dict[str, tuple[int, ...]]) -> None:
    tensors = {n: Tensor("BF16", np.zeros(s, np.uint16)) for n, s in shapes.items()}
    save_file(tensors, root / L.HEAD_WEIGHTS, metadata={"format": "pt"})


def _findings(root: Path) -> list[dict]:
    return [f.to_dict() for f in verify_checkpoint(read_checkpoint(root), str(root)).findings]


@pytest.mark.parametrize("case", list(BODIES))
def test_a_valid_head_the_reader_follows_in_part_verifies_ok(fresh, tmp_path: Path, case: str) -> None:
    root, _ = _valid_head(fresh, BODIES[case], tmp_path)
    findings = _findings(root)
    assert [f for f in findings if f["severity"] == "error"] == []
    notes = [f for f in findings if f["code"] == "head-code-invalid"]
    assert notes and all(f["severity"] == "info" for f in notes)


def test_where_the_reader_stopped_the_differences_are_a_note_naming_them(fresh, tmp_path: Path) -> None:
    root, _ = _valid_head(fresh, BODIES["stops-then-drops-a-bias"], tmp_path)
    (note,) = [f for f in _findings(root) if f["code"] == "head-code-invalid" and f.get("file") == L.HEAD_WEIGHTS]
    assert note["severity"] == "info" and "lacks proj.bias" in note["message"]
    assert "not an error: the statements after it may change the module tree" in note["message"]


def test_a_layer_the_reference_decided_is_still_judged_exactly(fresh, tmp_path: Path) -> None:
    """One subtree unknown (a dict comprehension), the layers decided: a transposed linear1 of a decided
    layer is an error from the reference, and no config finding claims the 2 x feedforward layers wrong."""
    root, shapes = _valid_head(fresh, BODIES["unknown-dict-and-2ff-layers"], tmp_path)
    name = "layers.1.linear1.weight"
    shapes[name] = shapes[name][::-1]
    _write(root, shapes)
    errors = [f for f in _findings(root) if f["severity"] == "error"]
    assert [(f["code"], f.get("tensor")) for f in errors] == [("head-incomplete", name)]
    assert f"builds BF16{list(shapes[name][::-1])}" in errors[0]["message"]


def test_a_config_fix_is_offered_only_when_the_reference_proves_it(fresh, tmp_path: Path) -> None:
    """Layers built with 2 x feedforward (128 rows at feedforward 64); the config then edited to 48. The
    layers' stored 128 is not the fix (with 128 the reference builds 256): no "set feedforward 128";
    the reference's mismatches are the errors. Edited back to 64, it verifies OK."""
    root, _ = _valid_head(fresh, LAYERS_2FF, tmp_path)
    config = json.loads((root / L.HEAD_CONFIG).read_text())
    (root / L.HEAD_CONFIG).write_text(json.dumps({**config, "feedforward": 48}))
    errors = [f for f in _findings(root) if f["severity"] == "error"]
    assert errors and {f["code"] for f in errors} == {"head-incomplete"}
    assert not any("128" in (f.get("fix") or "") for f in errors)
    (root / L.HEAD_CONFIG).write_text(json.dumps(config))
    assert [f for f in _findings(root) if f["severity"] == "error"] == []


DROPOUT_HEAD = ("import torch\nimport torch.nn as nn\n\n\nclass JointSchemaHead(nn.Module):\n"
                "    def __init__(self, hidden_size, width, routing_layers, layers, heads, feedforward, dropout=0.1):\n"
                "        super().__init__()\n"
                "        self.layers = nn.ModuleList([nn.TransformerEncoderLayer(width, heads, feedforward, dropout, "
                "batch_first=True) for _ in range(layers)])\n")


@pytest.mark.parametrize("dropout, ok", [(0.2, True), (1.5, False), ("0.1", False)])
def test_a_config_key_the_reference_takes_is_judged_by_what_torch_does_with_it(fresh, tmp_path: Path,
                                                                               dropout: object, ok: bool) -> None:
    """The config sets a key the reference's own head takes (``dropout``); torch refuses 1.5 and "0.1"
    (ValueError / TypeError in the layer's constructor): the head cannot be built, an error; 0.2 is OK."""
    root, _ = _valid_head(fresh, "", tmp_path, code=DROPOUT_HEAD)
    config = json.loads((root / L.HEAD_CONFIG).read_text())
    (root / L.HEAD_CONFIG).write_text(json.dumps({**config, "dropout": dropout}))
    errors = [f for f in _findings(root) if f["severity"] == "error"]
    if ok:
        assert errors == []
    else:
        assert [f["code"] for f in errors] == ["head-config-invalid"]
        assert "dropout probability has to be between 0 and 1" in errors[0]["message"]
        # the fix names the key, and followed (the key removed: the head's own default), it fixes
        assert errors[0]["fix"].startswith(f'remove "dropout" from {L.HEAD_CONFIG}')
        (root / L.HEAD_CONFIG).write_text(json.dumps(config))
        assert [f for f in _findings(root) if f["severity"] == "error"] == []
