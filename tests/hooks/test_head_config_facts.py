"""The serving hooks' head config comes from facts: the gate (what verify decides from the checkpoint's
own ``JointSchemaHead``) and the plugin's own class's signature, never from the list of keys the
project infers. With a refusal handler (tests, the ungated build) each refusal is handed over once."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any, Callable

import pytest

from clef_format.errors import IncompatibleError
from clef_format.fixtures.builders import HEAD_REFERENCES
from clef_format.spec import layouts as L
from clef_format.verify import verify
from clef_format.vllm import check_plugin_head, head_config, plugin_head_shapes

NEW = "0.2.0"
FIX = "re-download the joint head files of this revision, or install the plugin these weights were made for"
SIGNATURE = "def __init__(self, hidden_size, width, routing_layers, layers, heads, feedforward):"


def _class_from(path: Path, name: str) -> type:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.JointSchemaHead


def _edit_config(root: Path, edit: Callable[[dict], Any]) -> None:
    cfg = json.loads((root / L.HEAD_CONFIG).read_text())
    (root / L.HEAD_CONFIG).write_text(json.dumps(edit(cfg)))


def _with_dropout(fresh: Any) -> Path:
    """A checkpoint whose own head takes one more key than the inferred list (``dropout``), and
    whose config sets it: the facts (the reference file) say it is served."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    code = (root / L.HEAD_CODE).read_text()
    assert SIGNATURE in code
    (root / L.HEAD_CODE).write_text(code.replace(SIGNATURE, SIGNATURE[:-2] + ", dropout=0.1):"))
    _edit_config(root, lambda c: {**c, "dropout": 0.2})
    return root


def test_a_key_the_checkpoints_own_head_takes_is_served(fresh: Any) -> None:
    root = _with_dropout(fresh)
    assert [f for f in verify(str(root), plugin_version=NEW).findings if f.severity == "error"] == []
    cfg = head_config(root, NEW)
    assert cfg["dropout"] == 0.2 and L.MARKER_KEY not in cfg
    own = _class_from(root / L.HEAD_CODE, "own_head")
    assert check_plugin_head(root, NEW, own).layout == "layout-2"


def test_a_key_the_plugins_head_does_not_take_is_refused_before_it_is_built(fresh: Any) -> None:
    """The plugin's JointSchemaHead (the inferred one) has no ``dropout``: ``JointSchemaHead(**config)``
    would raise a TypeError at start; the hook refuses first, naming the key, with the fix."""
    root = _with_dropout(fresh)
    plugin = _class_from(HEAD_REFERENCES / "inferred.py", "plugin_inferred")
    with pytest.raises(IncompatibleError) as exc:
        check_plugin_head(root, NEW, plugin)
    assert exc.value.code == "head-unexpected" and exc.value.fix == FIX
    assert exc.value.reason.startswith(f"{L.HEAD_CONFIG}: the plugin's JointSchemaHead(**config) refuses it")
    assert "'dropout'" in exc.value.reason
    seen: list[IncompatibleError] = []
    assert check_plugin_head(root, NEW, plugin, seen.append).layout == "layout-2"
    assert [(e.code, e.reason, e.fix) for e in seen] == [(exc.value.code, exc.value.reason, FIX)]
    with pytest.raises(IncompatibleError) as again:
        plugin_head_shapes(plugin, head_config(root, NEW))
    assert again.value.code == "head-unexpected"


def test_a_key_the_plugins_head_needs_and_the_config_lacks_is_refused(fresh: Any, tmp_path: Path) -> None:
    root = fresh("layout-2", "bf16", head_reference="inferred")
    code = (HEAD_REFERENCES / "inferred.py").read_text()
    needy = tmp_path / "needy.py"
    needy.write_text(code.replace(SIGNATURE, SIGNATURE[:-2] + ", temperature):"))
    with pytest.raises(IncompatibleError) as exc:
        check_plugin_head(root, NEW, _class_from(needy, "plugin_needy"))
    assert exc.value.code == "head-incomplete" and exc.value.fix == FIX and "'temperature'" in exc.value.reason


def _missing_first_key(c: dict) -> dict:
    return {k: v for k, v in c.items() if k != "hidden_size"}


@pytest.mark.parametrize("edit, codes, config", [
    (_missing_first_key, ["head-incomplete"], "as read"),
    (lambda c: {**c, "zz_extra": 1}, ["head-unexpected"], "as read"),
    (lambda c: [1], ["bad-config"], {}),
    (lambda c: {**c, L.MARKER_KEY: ">=0.3.0"}, ["plugin-incompatible"], "as read"),
])
def test_head_config_hands_each_refusal_over_once(fresh: Any, edit: Any, codes: list, config: Any) -> None:
    """The gate's refusal reaches the handler; the hook adds no second verdict of its own, and returns
    the config as read without the marker (``{}`` for one that is not an object)."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    _edit_config(root, edit)
    seen: list[IncompatibleError] = []
    got = head_config(root, NEW, seen.append)
    assert [e.code for e in seen] == codes
    raw = json.loads((root / L.HEAD_CONFIG).read_text())
    assert got == ({k: v for k, v in raw.items() if k != L.MARKER_KEY} if config == "as read" else config)
    with pytest.raises(IncompatibleError) as exc:
        head_config(root, NEW)
    assert exc.value.code == codes[0]


def test_check_plugin_head_hands_over_the_gates_refusal_then_its_own(fresh: Any) -> None:
    """Weights the plugin version cannot serve and a head file the plugin's head cannot load: with a
    handler both reach it, in that order, each with its own fix; the checkpoint comes back."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    _edit_config(root, lambda c: {**c, L.MARKER_KEY: ">=0.3.0"})
    plugin = plugin_head_shapes(_class_from(HEAD_REFERENCES / "inferred.py", "plugin_inferred2"),
                                head_config(root, NEW, lambda e: None))
    plugin["extra_a"] = ()
    plugin["extra_b"] = ()
    seen: list[IncompatibleError] = []
    assert check_plugin_head(root, NEW, plugin, seen.append).layout == "layout-2"
    assert [e.code for e in seen] == ["plugin-incompatible", "head-incomplete"]
    assert seen[1].fix == FIX and seen[1].reason.endswith("(and 1 more)")
    assert seen[1].reason.startswith(f"{L.HEAD_WEIGHTS}: lacks extra_a")


def test_check_plugin_head_hands_over_a_missing_head_file(fresh: Any) -> None:
    root = fresh("layout-2", "bf16", head_reference="inferred")
    (root / L.HEAD_WEIGHTS).unlink()
    seen: list[IncompatibleError] = []
    assert check_plugin_head(root, NEW, {"w": (1,)}, seen.append).layout == "layout-2"
    assert [e.code for e in seen] == ["missing-file", "missing-file"]
    assert (seen[1].reason, seen[1].fix) == (f"{L.HEAD_WEIGHTS} is missing", FIX)


def test_a_plugin_head_that_needs_real_data_to_build_is_built_on_the_cpu(fresh: Any, tmp_path: Path) -> None:
    """``.item()`` in ``__init__`` cannot run on torch's meta device; the class builds on the CPU and
    matches the file: served, not a raw RuntimeError at start."""
    root = fresh("layout-2", "bf16", head_reference="inferred")
    code = (HEAD_REFERENCES / "inferred.py").read_text()
    source = tmp_path / "item.py"
    source.write_text(code + "\n\nclass WithItem(JointSchemaHead):\n    def __init__(self, **kw):\n"
                      "        super().__init__(**kw)\n        self.start = float(self.prior_logit_scale.item())\n")
    spec = importlib.util.spec_from_file_location("plugin_item", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert check_plugin_head(root, NEW, module.WithItem).layout == "layout-2"


def test_a_plugin_head_whose_constructor_raises_is_a_coded_refusal(fresh: Any, tmp_path: Path) -> None:
    root = fresh("layout-2", "bf16", head_reference="inferred")
    code = (HEAD_REFERENCES / "inferred.py").read_text()
    source = tmp_path / "raises.py"
    source.write_text(code.replace("        super().__init__()\n",
                                   "        super().__init__()\n        torch.nn.Dropout(1.5)\n", 1))
    with pytest.raises(IncompatibleError) as exc:
        check_plugin_head(root, NEW, _class_from(source, "plugin_raises"))
    assert exc.value.code == "head-config-invalid" and exc.value.fix == FIX
    assert "raises ValueError: dropout probability has to be between 0 and 1" in exc.value.reason


@pytest.mark.parametrize("head", [None, 3, "JointSchemaHead"])
def test_something_that_is_no_head_is_a_usage_error(fresh: Any, head: Any) -> None:
    from clef_format.errors import UsageError

    root = fresh("layout-2", "bf16", head_reference="inferred")
    with pytest.raises(UsageError) as exc:
        check_plugin_head(root, NEW, head)
    assert "is not a head" in str(exc.value) and "JointSchemaHead class" in exc.value.fix
