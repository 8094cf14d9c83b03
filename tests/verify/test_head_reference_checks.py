"""The joint head checked from facts (verify/checks/head.py): the checkpoint's own joint_schema_model.py
first, the published figures where it cannot be read, the inferred names only as a note.

Every valid head of every reference definition verifies OK and migrates; every single mutation of one
(a tensor dropped, one added, a matrix transposed, an attention projection of the wrong shape, a
feedforward width the layers do not have, another dtype) is an error. The release-sized head (122 BF16
tensors, 243,538,016 bytes) verifies OK with or without its reference file read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from clef_format.fixtures.builders import head_reference_code, head_shapes
from clef_format.fixtures.sparse import write_sparse
from clef_format.fixtures.tensors import Tensor, bf16, generator, save_file
from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L
from clef_format.spec.joint_head import RELEASE_CONFIG, RELEASE_FILE_BYTES, RELEASE_TENSORS
from clef_format.verify.checks.head import check_head
from clef_format.verify.run import verify_checkpoint
from tests.support.migrate import cli, migrate_json

REFERENCES = ("inferred", "release", "rms_blocks", "subclassed", "helpers", "functional")
HEAD_ERRORS = {"head-incomplete", "head-unexpected", "head-config-invalid"}


def _errors(root: Path) -> list[dict]:
    return [f.to_dict() for f in verify_checkpoint(read_checkpoint(root), str(root)).findings if f.severity == "error"]


def _head_findings(root: Path) -> list[dict]:
    return [f.to_dict() for f in check_head(read_checkpoint(root))]


def _config(root: Path) -> dict:
    return json.loads((root / L.HEAD_CONFIG).read_text())


def _write_head(root: Path, entries: dict[str, tuple[str, tuple[int, ...]]]) -> None:
    g = generator(7)
    tensors = {n: bf16(s, g) if d == "BF16" else Tensor(d, np.zeros(s, np.float32)) for n, (d, s) in entries.items()}
    save_file(tensors, root / L.HEAD_WEIGHTS, metadata={"format": "pt"})


def _entries(root: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {n: (i.dtype, i.shape) for n, i in read_header(root / L.HEAD_WEIGHTS).tensors.items()}


@pytest.mark.parametrize("name", REFERENCES)
def test_each_reference_heads_checkpoint_verifies_ok(fresh, name: str) -> None:
    root = fresh("layout-2", "bf16", head_reference=name)
    assert (root / L.HEAD_CODE).read_text() == head_reference_code(name)
    assert _errors(root) == []
    assert not [f for f in _head_findings(root) if f["code"] == "head-names-inferred"]


@pytest.mark.parametrize("name", REFERENCES)
def test_each_reference_heads_checkpoint_migrates(fresh, name: str) -> None:
    root = fresh("layout-1", "hybrid", head_reference=name)
    code, out = migrate_json(str(root))
    assert code == 0, out
    assert _errors(root) == []


def _first(entries: dict, pred) -> str:
    return next(n for n in sorted(entries) if pred(n, entries[n]))


def _drop(e: dict) -> None:
    e.pop(_first(e, lambda n, v: n.startswith("layers.")))


def _add(e: dict) -> None:
    e["option_gate.weight"] = ("BF16", (4,))


def _add_inside(e: dict) -> None:
    layer = _first(e, lambda n, v: n.startswith("layers.0.")).split(".")[:2]
    e[".".join(layer + ["extra_norm", "weight"])] = ("BF16", (32,))


def _transpose(e: dict) -> None:
    name = _first(e, lambda n, v: len(v[1]) == 2 and v[1][0] != v[1][1] and n.startswith(("layers.", "evidence")))
    e[name] = (e[name][0], tuple(reversed(e[name][1])))


def _wrong_in_proj(e: dict) -> None:
    name = _first(e, lambda n, v: n.endswith("in_proj_weight") or n.endswith(".q.weight"))
    rows, cols = e[name][1]
    e[name] = (e[name][0], (cols, rows * 3) if rows != cols else (rows, 3 * cols))


def _dtype(e: dict) -> None:
    name = _first(e, lambda n, v: True)
    e[name] = ("F32", e[name][1])


MUTATIONS = {"drop": _drop, "add": _add, "add-inside": _add_inside, "transpose": _transpose,
             "in-proj": _wrong_in_proj, "dtype": _dtype}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
@pytest.mark.parametrize("name", REFERENCES)
def test_each_single_mutation_of_each_head_is_an_error(fresh, name: str, mutation: str) -> None:
    root = fresh("layout-2", "bf16", head_reference=name)
    entries = _entries(root)
    MUTATIONS[mutation](entries)
    _write_head(root, entries)
    errors = [f for f in _head_findings(root) if f["severity"] == "error"]
    assert errors and {f["code"] for f in errors} <= HEAD_ERRORS, errors


@pytest.mark.parametrize("name", REFERENCES)
def test_a_feedforward_the_layers_were_not_built_with_is_an_error(fresh, name: str) -> None:
    root = fresh("layout-2", "bf16", head_reference=name)
    cfg = _config(root)
    (root / L.HEAD_CONFIG).write_text(json.dumps({**cfg, "feedforward": cfg["feedforward"] * 2}))
    assert {f["code"] for f in _head_findings(root) if f["severity"] == "error"} & HEAD_ERRORS


# ---- the release-sized head: facts decide where the reference is not read
def _release_head(root: Path, code: str | None = None, entries: dict | None = None) -> None:
    """The release config and the release-sized head (sparse data) in a tiny checkpoint."""
    shapes = head_shapes(head_reference_code("release"), RELEASE_CONFIG)
    write_sparse(root / L.HEAD_WEIGHTS, entries or {n: ("BF16", s) for n, s in shapes.items()}, {"format": "pt"})
    (root / L.HEAD_CONFIG).write_text(json.dumps({**RELEASE_CONFIG, L.MARKER_KEY: ">=0.2.0"}))
    (root / L.HEAD_CODE).write_text(code if code is not None else head_reference_code("release"))


def _not_backbone(findings: list[dict]) -> list[dict]:
    return [f for f in findings if "differs from the backbone" not in f["message"]]


#: A reference file the reader cannot follow: the head builds itself in a helper it cannot see into.
UNREAD = "from torch import nn\n\nclass JointSchemaHead(nn.Module):\n    def __init__(self, **config):\n" \
         "        super().__init__()\n        build_from(self, config)\n"


@pytest.mark.parametrize("code", [None, UNREAD, "x" * (1024 * 1024 + 1)], ids=["read", "not-followed", "too-big"])
def test_the_release_sized_head_verifies_ok(fresh, code: str | None) -> None:
    root = fresh("layout-2", "bf16")
    _release_head(root, code)
    assert (root / L.HEAD_WEIGHTS).stat().st_size == RELEASE_FILE_BYTES
    assert len(read_header(root / L.HEAD_WEIGHTS).tensors) == RELEASE_TENSORS
    findings = _not_backbone(_head_findings(root))
    assert [f for f in findings if f["severity"] == "error"] == []
    if code is not None:  # only facts judged it; the 6 tensors no inferred name covers are a note
        notes = {f["code"] for f in findings}
        assert "head-names-inferred" in notes and {f["severity"] for f in findings} == {"info"}


def _release_entries() -> dict:
    return {n: ("BF16", s) for n, s in head_shapes(head_reference_code("release"), RELEASE_CONFIG).items()}


def _bad_stack(e: dict) -> None:
    e.pop("layers.1.norm3.bias")
    e["layers.1.norm4.bias"] = ("BF16", (1024,))


FACT_MUTATIONS = {
    "drop": lambda e: e.pop("residual_gate"),
    "add": lambda e: e.update({"residual_bias": ("BF16", ())}),
    "transpose-linear1": lambda e: e.update({"layers.2.linear1.weight": ("BF16", (1024, 4096)),
                                             "layers.2.linear2.weight": ("BF16", (4096, 1024))}),
    "in-proj-w-3w": lambda e: e.update({"layers.0.self_attn.in_proj_weight": ("BF16", (1024, 3072))}),
    "resized": lambda e: e.update({"option_score_norm.weight": ("BF16", (1028,))}),
    "stack-asymmetry": _bad_stack,
    "dtype": lambda e: e.update({"residual_gate": ("F32", ())}),
}


@pytest.mark.parametrize("mutation", list(FACT_MUTATIONS))
def test_each_mutation_of_the_release_sized_head_is_an_error_from_facts_alone(fresh, mutation: str) -> None:
    root = fresh("layout-2", "bf16")
    entries = _release_entries()
    FACT_MUTATIONS[mutation](entries)
    _release_head(root, UNREAD, entries)
    errors = [f for f in _not_backbone(_head_findings(root)) if f["severity"] == "error"]
    assert errors and {f["code"] for f in errors} <= HEAD_ERRORS, errors


def test_a_feedforward_equal_to_width_while_linear1_has_more_rows_is_an_error_from_torchs_shapes(fresh) -> None:
    root = fresh("layout-2", "bf16")
    _release_head(root, UNREAD)
    (root / L.HEAD_CONFIG).write_text(json.dumps({**RELEASE_CONFIG, "feedforward": 1024}))
    errors = [f for f in _not_backbone(_head_findings(root)) if f["severity"] == "error"]
    assert any(f.get("tensor") == "layers.0.linear1.weight" and "torch's transformer layer" in f["message"]
               for f in errors), errors


def test_a_head_differing_only_from_the_inferred_names_is_only_a_note(fresh) -> None:
    """Tiny config, no reference read: renamed top-level tensors are a note, never an error."""
    root = fresh("layout-2", "bf16")
    entries = _entries(root)
    entries["prior_scale"] = entries.pop("prior_logit_scale")
    _write_head(root, entries)
    (root / L.HEAD_CODE).write_text(UNREAD)
    findings = _head_findings(root)
    assert [f for f in findings if f["severity"] == "error"] == []
    assert any(f["code"] == "head-names-inferred" and "prior_logit_scale" in f["message"] for f in findings)


# ---- the reference file itself
def test_a_reference_that_is_not_python_is_one_error_and_never_runs(fresh, tmp_path: Path) -> None:
    root = fresh("layout-2", "bf16")
    marker = tmp_path / "ran"
    (root / L.HEAD_CODE).write_text(f"open({str(marker)!r}, 'w')\nclass JointSchemaHead(:\n")
    proc = cli("verify", str(root), "--json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and not marker.exists()
    (finding,) = [f for f in report["findings"] if f["code"] == "head-code-invalid"]
    assert finding["severity"] == "error" and finding["file"] == L.HEAD_CODE
    assert "line 2" in finding["message"]


@pytest.mark.parametrize("where", ["top", "init"])
def test_a_reference_that_would_run_commands_is_read_not_run(fresh, tmp_path: Path, where: str) -> None:
    root = fresh("layout-2", "bf16")
    marker = tmp_path / "ran"
    run = f"import os; os.system('touch {marker}'); open({str(marker)!r}, 'w')"
    code = head_reference_code("inferred")
    if where == "top":
        code = run + "\n" + code
    else:
        code = code.replace("super().__init__()", f"super().__init__()\n        {run}")
    (root / L.HEAD_CODE).write_text(code)
    proc = cli("verify", str(root), "--json")
    assert not marker.exists()
    assert proc.returncode in (0, 1) and json.loads(proc.stdout)["path"]


# ---- a reference the reader must not trust, or cannot follow
_PATCH = ("class _Gain(nn.Module):\n    def __init__(self, w):\n        super().__init__()\n"
          "        self.g = nn.Parameter(torch.ones(w, 2))\n\n\nnn.LayerNorm = _Gain\n\n\n")


def test_a_reference_that_patches_torch_is_not_trusted(fresh) -> None:
    """torch would build hidden_norm.g [w, 2]: the head with torch's hidden_norm.weight/bias is not called exact."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    code = head_reference_code("inferred").replace("\n\nclass JointSchemaHead", "\n\n" + _PATCH + "class JointSchemaHead")
    (root / L.HEAD_CODE).write_text(code)
    findings = _head_findings(root)
    (note,) = [f for f in findings if f["code"] == "head-code-invalid"]
    assert note["severity"] == "info" and "nn.LayerNorm" in note["message"] and "line " in note["message"], note


def test_a_module_the_reference_deletes_is_not_required(fresh) -> None:
    root = fresh("layout-2", "bf16", head_reference="inferred")
    code = head_reference_code("inferred")
    code = code.replace("        self.option_norm = nn.LayerNorm(width)\n",
                        "        self.option_norm = nn.LayerNorm(width)\n        del self.field_norm\n")
    (root / L.HEAD_CODE).write_text(code)
    _write_head(root, {n: v for n, v in _entries(root).items() if not n.startswith("field_norm.")})
    assert [f for f in _head_findings(root) if f["severity"] != "info"] == []


def _renamed_stacks(root: Path, stop: str) -> None:
    """A reference naming its stacks ``encoder`` / ``decoder`` with a statement the reader stops at, and the
    head that reference builds."""
    code = head_reference_code("inferred").replace("self.evidence_layers", "self.encoder").replace(
        "self.layers", "self.decoder").replace("        self.field_norm", f"        {stop}\n        self.field_norm")
    (root / L.HEAD_CODE).write_text(code)
    entries = {n.replace("evidence_layers.", "encoder.", 1) if n.startswith("evidence_layers.") else
               n.replace("layers.", "decoder.", 1) if n.startswith("layers.") else n: v
               for n, v in _entries(root).items()}
    _write_head(root, entries)


def test_a_reference_the_reader_cannot_follow_is_named_and_stack_names_are_only_a_note(fresh) -> None:
    """Valid Python the reader does not evaluate: an info naming the line and construct; at a config other
    than the release's, stack counts hang on the inferred stack names, so they are a note, not an error."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    _renamed_stacks(root, "while False:\n            pass")
    findings = _head_findings(root)
    assert [f for f in findings if f["severity"] != "info"] == [], findings
    (stop,) = [f for f in findings if f["code"] == "head-code-invalid"]
    line = head_reference_code("inferred").split("\n").index("        self.field_norm = nn.LayerNorm(width)") + 1
    assert f"line {line} (While)" in stop["message"], stop
    (names,) = [f for f in findings if f["code"] == "head-names-inferred"]
    assert "lacks layer evidence_layers.0" in names["message"]


def test_a_fact_found_after_the_reader_stopped_names_where_it_stopped_not_re_download(fresh) -> None:
    root = fresh("layout-2", "bf16")
    entries = _release_entries()
    entries.pop("residual_gate")
    _release_head(root, UNREAD, entries)
    errors = [f for f in _not_backbone(_head_findings(root)) if f["severity"] == "error"]
    assert errors and all("re-download" not in f["fix"] and "line 6 (build_from)" in f["fix"] for f in errors), errors


# ---- statements torch's tree does not depend on, module-level helpers, unknown subtrees
def _last_layer(entries: dict) -> str:
    return max({n.split(".")[1] for n in entries if n.startswith("layers.")}, key=int)


@pytest.mark.parametrize("statement", [
    'print("building head", width)',
    'import logging\n        logging.getLogger(__name__).info("width %d", width)',
    'import warnings\n        warnings.warn("building head")',
])
def test_a_printed_logged_or_warned_statement_does_not_stop_the_reader(fresh, statement: str) -> None:
    """torch's load_state_dict fails with Missing keys on a head lacking a whole layer: so must verify."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    code = head_reference_code("inferred").replace("super().__init__()\n", f"super().__init__()\n        {statement}\n", 1)
    (root / L.HEAD_CODE).write_text(code)
    entries = _entries(root)
    last = _last_layer(entries)
    _write_head(root, {n: v for n, v in entries.items() if not n.startswith(f"layers.{last}.")})
    findings = _head_findings(root)
    assert not [f for f in findings if f["code"] == "head-code-invalid"], findings
    assert any(f["severity"] == "error" and f["message"].endswith(f"lacks layers.{last} (18 tensors), which "
                                                                     f"{L.HEAD_CODE} builds") for f in findings), findings


_HELPERS = ("def f0(w):\n    return nn.Linear(w, w)\n\n\ndef f1(w):\n    return nn.Sequential(f0(w), nn.GELU(), f0(w))\n"
            "\n\n")


def _with_extra(root: Path, helpers: str, extra: str) -> None:
    code = head_reference_code("inferred").replace("\nclass JointSchemaHead", "\n" + helpers + "class JointSchemaHead")
    code = code.replace("super().__init__()\n", f"super().__init__()\n        self.x = {extra}\n", 1)
    (root / L.HEAD_CODE).write_text(code)


@pytest.mark.parametrize("extra", ["f0(width)", "f1(width)"])
def test_a_module_built_by_a_helper_function_is_required(fresh, extra: str) -> None:
    root = fresh("layout-2", "bf16", head_reference="inferred")
    _with_extra(root, _HELPERS, extra)
    findings = _head_findings(root)
    assert not [f for f in findings if f["code"] in ("head-code-invalid", "head-names-inferred")], findings
    assert any(f["severity"] == "error" and f["tensor"] == "x" for f in findings), findings


def test_a_subtree_the_reader_cannot_tell_is_named_and_only_its_tensors_are_compared_to_inferred_names(fresh) -> None:
    """Only x is unknown: an info names its line and construct; the head holding every tensor the reference
    decided is not said to lack them, and x's tensors are judged by the facts."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    _with_extra(root, "def f0(w):\n    return nn.Bilinear(w, w, 1)\n\n\n", "f0(width)")
    entries = _entries(root)
    width = entries["type_embedding.weight"][1][1]
    _write_head(root, {**entries, "x.weight": ("BF16", (1, width, width)), "x.bias": ("BF16", (1,))})
    findings = _head_findings(root)
    assert [f for f in findings if f["severity"] != "info"] == [], findings
    (note,) = [f for f in findings if f["code"] == "head-code-invalid"]
    line = (root / L.HEAD_CODE).read_text().split("\n").index("    return nn.Bilinear(w, w, 1)") + 1
    assert f"x (built at line {line} (torch.nn.Bilinear))" in note["message"], note
    inferred = " ".join(f["message"] for f in findings if f["code"] == "head-names-inferred")
    assert not any(n in inferred for n in entries) and "lacks" not in inferred, inferred


def test_at_the_release_config_a_small_unknown_subtree_leaves_the_decided_stacks_alone(fresh) -> None:
    """The release head whose option_norm the reader cannot decide (an if on the device): the stacks the
    reference decided are not reported missing from the unknown subtree, and nothing is an error."""
    root = fresh("layout-2", "bf16")
    code = head_reference_code("release").replace("\nclass EvidenceLayer", "\ndef norm(w):\n    return nn.LayerNorm(w) "
                                                  "if torch.cuda.is_available() else nn.LayerNorm(w)\n\n\n"
                                                  "class EvidenceLayer", 1)
    code = code.replace("        self.option_norm = nn.LayerNorm(width)", "        self.option_norm = norm(width)")
    _release_head(root, code)
    findings = _not_backbone(_head_findings(root))
    assert [f for f in findings if f["severity"] != "info"] == [], findings
    (note,) = [f for f in findings if f["code"] == "head-code-invalid"]
    assert "option_norm (built at line " in note["message"], note
    assert not any("lacks" in f["message"] for f in findings), findings
