"""The static reader of joint_schema_model.py (spec/head_reference.py), against its oracle: real torch.

Each reference definition of fixtures/head_references is imported and built with torch on the meta
device; its state_dict's names and shapes must be exactly what the reader reads from the file's syntax
tree, at several configs. Hostile files are never run (each would create a marker file if it were) and
never crash the reader.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from clef_format.fixtures.builders import HEAD_REFERENCES
from clef_format.read.safetensors import encode_header
from clef_format.spec.head_reference import (
    CONTAINER_ATTRS, MAX_SOURCE_BYTES, MODULE_ATTRS, TORCH_PARAMS, read_reference,
)
from clef_format.spec.joint_head import (
    RELEASE_CONFIG, RELEASE_FILE_BYTES, RELEASE_TENSORS, HeadConfig, all_tensors,
)

torch = pytest.importorskip("torch")

TINY = {"hidden_size": 64, "width": 32, "routing_layers": 2, "layers": 4, "heads": 4, "feedforward": 64}
ODD = {"hidden_size": 48, "width": 24, "routing_layers": 3, "layers": 1, "heads": 6, "feedforward": 40}
REFERENCES = sorted(p.stem for p in HEAD_REFERENCES.glob("*.py"))


def _torch_state(path: Path, config: dict) -> dict[str, tuple[int, ...]]:
    spec = importlib.util.spec_from_file_location(f"ref_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import does (dataclasses look their module up there)
    try:
        spec.loader.exec_module(module)
        with torch.device("meta"):
            head = module.JointSchemaHead(**config)
    finally:
        sys.modules.pop(spec.name, None)
    return {k: tuple(v.shape) for k, v in head.state_dict().items()}


def test_there_are_several_reference_definitions() -> None:
    assert {"inferred", "release", "rms_blocks", "subclassed", "helpers", "conventional", "functional"} <= set(REFERENCES)


@pytest.mark.parametrize("config", [RELEASE_CONFIG, TINY, ODD], ids=["release", "tiny", "odd"])
@pytest.mark.parametrize("name", REFERENCES)
def test_the_reader_reads_what_torch_builds(name: str, config: dict) -> None:
    path = HEAD_REFERENCES / f"{name}.py"
    ref = read_reference(path.read_bytes(), config)
    assert (ref.status, ref.unknown, ref.fails, ref.rejected) == ("ok", (), "", ())
    assert ref.tensors == _torch_state(path, config)


def test_the_inferred_reference_builds_the_inferred_names() -> None:
    ref = read_reference((HEAD_REFERENCES / "inferred.py").read_bytes(), RELEASE_CONFIG)
    assert ref.tensors == all_tensors(HeadConfig(**RELEASE_CONFIG))
    assert len(ref.tensors) == 116


def test_the_release_sized_reference_lands_on_the_published_figures() -> None:
    """122 BF16 tensors and 243,538,016 bytes, as the arithmetic below shows."""
    ref = read_reference((HEAD_REFERENCES / "release.py").read_bytes(), RELEASE_CONFIG)
    h, w, ff = 4096, 1024, 4096
    mha = 3 * w * w + 3 * w + w * w + w                      # in_proj weight/bias, out_proj weight/bias
    ffn = ff * w + ff + w * ff + w                           # two linears with biases
    evidence = mha + 2 * 2 * w + ffn + 2 * w                 # attention, 2 norms, feed-forward, 2 gates [w]
    decoder = 2 * mha + ffn + 3 * 2 * w                      # self + cross attention, feed-forward, 3 norms
    params = (2 * h + 6 * w * h + 3 * w + 2 * evidence + 4 * decoder + 3 * 2 * w
              + (4 * w * w + w) + (w + 1) + 3)               # norms, projections, types, stacks, scorer, scalars
    assert params == sum(_numel(s) for s in ref.tensors.values()) == 121_762_820
    tensors = 2 + 6 + 1 + 2 * 14 + 4 * 18 + 3 * 2 + 4 + 3
    assert tensors == len(ref.tensors) == RELEASE_TENSORS == 122
    header, data = encode_header([(n, "BF16", s) for n, s in sorted(ref.tensors.items())], {"format": "pt"})
    assert data == 2 * params
    assert len(header) == 8 + 12_368
    assert len(header) + data == RELEASE_FILE_BYTES == 243_538_016


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


@pytest.mark.parametrize("source, kwargs", [
    ("nn.Linear(7, 5)", {}), ("nn.Linear(7, 5, bias=False)", {}),
    ("nn.LayerNorm(9)", {}), ("nn.LayerNorm((3, 4), elementwise_affine=False)", {}), ("nn.LayerNorm(9, bias=False)", {}),
    ("nn.RMSNorm(9)", {}), ("nn.Embedding(11, 6)", {}),
    ("nn.MultiheadAttention(8, 2)", {}), ("nn.MultiheadAttention(8, 2, bias=False, add_bias_kv=True)", {}),
    ("nn.MultiheadAttention(8, 2, kdim=5, vdim=3)", {}),
    ("nn.TransformerEncoderLayer(8, 2, 12)", {}), ("nn.TransformerEncoderLayer(8, 2, bias=False)", {}),
    ("nn.TransformerDecoderLayer(d_model=8, nhead=4, dim_feedforward=20)", {}),
    ("nn.Sequential(nn.Linear(3, 4), nn.GELU(), nn.Dropout(), nn.Linear(4, 2))", {}),
    ("nn.Conv1d(8, 4, 3)", {}), ("nn.Conv1d(8, 8, kernel_size=5, padding=2, groups=8, bias=False)", {}),
    ("nn.Conv2d(6, 4, (3, 2), groups=2)", {}), ("nn.Conv3d(2, 3, 2)", {}),
    ("nn.TransformerEncoder(nn.TransformerEncoderLayer(8, 2, 12), 3, enable_nested_tensor=False)", {}),
    ("nn.TransformerEncoder(encoder_layer=nn.TransformerEncoderLayer(8, 2, bias=False), num_layers=2, "
     "norm=nn.LayerNorm(8), enable_nested_tensor=False)", {}),
    ("nn.TransformerDecoder(nn.TransformerDecoderLayer(8, 4, 16), 2, nn.RMSNorm(8))", {}),
    ("nn.GRU(5, 7)", {}), ("nn.GRU(5, 7, num_layers=2, bidirectional=True, bias=False)", {}),
    ("nn.LSTM(5, 7, 3)", {}), ("nn.LSTM(5, 7, num_layers=2, bidirectional=True, proj_size=3)", {}),
    ("nn.RNN(5, 7)", {}), ("nn.RNN(5, 7, 2, 'relu', False, bidirectional=True)", {}),
    ("nn.ConvTranspose1d(8, 4, 3)", {}), ("nn.ConvTranspose2d(6, 4, (3, 2), groups=2, bias=False)", {}),
    ("nn.ConvTranspose3d(2, 6, 2, 1, 0, 0, 2)", {}),
    ("nn.Transformer(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=1, dim_feedforward=12)", {}),
    ("nn.Transformer(8, 2, 1, 2, 16, bias=False)", {}),
])
def test_torch_layer_shapes_are_torchs_own(tmp_path: Path, source: str, kwargs: dict) -> None:
    code = f"import torch\nfrom torch import nn\n\nclass JointSchemaHead(nn.Module):\n    def __init__(self):\n" \
           f"        super().__init__()\n        self.m = {source}\n"
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {})
    assert (ref.status, ref.unknown) == ("ok", ())
    assert ref.tensors == _torch_state(path, {})


def test_every_torch_class_the_reader_knows_is_tested() -> None:
    source = " ".join(p[0] for p in test_torch_layer_shapes_are_torchs_own.pytestmark[0].args[1])
    assert all(name in source for name in TORCH_PARAMS)


# ---- what the reader cannot evaluate is unknown, never guessed
HEAD = "import torch\nfrom torch import nn\n\nclass JointSchemaHead(nn.Module):\n    def __init__(self, width):\n" \
       "        super().__init__()\n"


@pytest.mark.parametrize("body, unknown", [
    ("self.a = nn.Linear(width, 2)\n        self.b = nn.Bilinear(width, 2, 3)\n", ("b",)),
    ("self.a = nn.Linear(width, 2)\n        self.b = make_block(width)\n", ("b",)),
    ("if torch.cuda.is_available():\n            self.b = nn.Linear(2, 2)\n        self.a = nn.Linear(width, 2)\n",
     ("b",)),
    ("self.a = nn.Linear(width, 2)\n        while True:\n            pass\n", ("",)),
    ("self.a = nn.Linear(width, 2)\n        self.b = nn.ModuleList([nn.Linear(2, 2) for _ in range(10**9)])\n", ("b",)),
    ("self.a = nn.Linear(width, 2)\n        self.b = nn.Linear(10**10**10, 2)\n", ("b",)),
    ("self.a = nn.Linear(width, 2)\n        self.apply(init)\n", ("",)),  # apply may do anything to any module
    # apply of the file's own function that adds a module, or recasts one: not followed
    ("self.a = nn.Linear(width, 2)\n        self.apply(self._grow)\n\n    def _grow(self, m):\n"
     "        m.add_module('extra', nn.Linear(2, 2))\n", ("",)),
    ("self.a = nn.Linear(width, 2)\n        self.apply(self._cast)\n\n    def _cast(self, m):\n        m.bfloat16()\n",
     ("",)),
    # an undecided if that binds a name used later is not skipped
    ("self.a = nn.Linear(width, 2)\n        if torch.cuda.is_available():\n            width = 4\n"
     "        self.b = nn.Linear(width, 2)\n", ("",)),
    ("self.a = nn.Linear(width, 2)\n        self.s = nn.Parameter(torch.tensor(math.exp(1e6)))\n", ("s",)),
    ("self.a = nn.Linear(width, 2)\n        self.b = nn.Linear(int(math.sqrt(width)), 2)\n", ()),
    # a statement the reader cannot evaluate that is given self, a module or a list may change the tree
    ("self.a = nn.Linear(width, 2)\n        print(self)\n", ("",)),
    ("self.a = nn.Linear(width, 2)\n        m = nn.Linear(2, 2)\n        register(m)\n        self.b = m\n", ("",)),
    ("self.a = nn.Linear(width, 2)\n        blocks = []\n        fill(blocks)\n        self.b = nn.ModuleList(blocks)\n",
     ("",)),
    ("self.a = nn.Linear(width, 2)\n        if torch.cuda.is_available():\n            register(self.a)\n", ("",)),
    ("self.a = nn.Linear(width, 2)\n        if torch.cuda.is_available():\n            if width:\n"
     "                return\n        self.b = nn.Linear(2, 2)\n", ("",)),
])
def test_what_the_reader_cannot_evaluate_is_an_unknown_subtree(body: str, unknown: tuple[str, ...]) -> None:
    ref = read_reference(("import math\n" + HEAD + "        " + body).encode(), {"width": 8})
    assert ref.status == "ok" and ref.unknown == unknown
    assert len(ref.why) == len(ref.unknown) and all(w.startswith("line ") for w in ref.why), ref
    assert ref.tensors["a.weight"] == (2, 8)


def test_a_key_the_constructor_does_not_take_is_rejected_and_a_missing_one_fails() -> None:
    code = (HEAD + "        self.a = nn.Linear(width, 2)\n").encode()
    extra = read_reference(code, {"width": 8, "dropout": 0.1})
    assert extra.rejected == ("dropout",) and extra.tensors == {"a.weight": (2, 8), "a.bias": (2,)}
    missing = read_reference(code, {})
    assert missing.fails_kind == "missing" and "width" in missing.fails


def test_an_attention_whose_heads_do_not_divide_the_width_fails_as_torch_does() -> None:
    code = (HEAD + "        self.a = nn.MultiheadAttention(width, 3)\n").encode()
    assert read_reference(code, {"width": 8}).fails_kind == "fails"
    with pytest.raises(AssertionError):
        torch.nn.MultiheadAttention(8, 3, device="meta")


@pytest.mark.parametrize("layer", ["nn.Linear(width, width / 2)", "nn.Linear(width / 2, width)", "nn.Linear(width, -1)",
                                   "nn.LayerNorm(width / 1)", "nn.Embedding(-3, width)",
                                   "nn.TransformerEncoderLayer(width, 2, width * 1.5)",
                                   "nn.Parameter(torch.zeros(width / 4))", "nn.Linear(width, round(width / 2, 0))",
                                   "nn.Linear(width, 4 ** 0.5)"])
def test_a_size_torch_cannot_allocate_fails_as_torch_does(layer: str) -> None:
    """A float or negative size is torch's own TypeError / RuntimeError (``torch.empty``): the head fails
    to build at this config, a fact, not an unknown subtree that verifies OK."""
    code = (HEAD + f"        self.a = {layer}\n").encode()
    ref = read_reference(code, {"width": 8})
    assert ref.fails_kind == "fails" and "is not a tensor size" in ref.fails, ref
    with pytest.raises((TypeError, RuntimeError)):
        eval(layer, {"nn": torch.nn, "torch": torch, "width": 8})


@pytest.mark.parametrize("layer", [
    "nn.Dropout(1.5)", "nn.Dropout(p='0.1')", "nn.TransformerEncoderLayer(width, 2, 16, dropout=1.5)",
    "nn.TransformerDecoderLayer(width, 2, 16, activation='swish')", "nn.Transformer(width, 2, 1, 1, 16, dropout=-0.1)",
    "nn.Embedding(5, width, padding_idx=5)", "nn.Embedding(5, width, padding_idx=-6)",
    "nn.ModuleList([nn.Linear(width, 2), 3])", "nn.Sequential(nn.Linear(width, 2), 'x')",
    "nn.ModuleDict({1: nn.Linear(width, 2)})", "nn.ModuleDict({'a.b': nn.Linear(width, 2)})",
    "nn.GRU(width, 4, dropout=True)", "nn.LSTM(width, 4, dropout=2.0)",
    "nn.Dropout(None)", "nn.Dropout([0.1])", "nn.TransformerEncoderLayer(width, 2, 16, dropout=None)",
    "nn.Embedding(5, width, padding_idx=2.0)", "nn.ModuleList([nn.Parameter(torch.zeros(2))])",
    "nn.LSTM(width, width / 2)", "nn.GRU(width, 4, 2.0)",
    "nn.TransformerEncoder(nn.TransformerEncoderLayer(width, 2, 16), 2.0)",
])
def test_a_construction_torch_refuses_fails_as_torch_does(layer: str) -> None:
    """torch's own checks in the constructors (a dropout probability, an activation name, padding_idx,
    what a container registers): the head cannot be built, a fact, never an OK."""
    code = (HEAD + f"        self.a = {layer}\n").encode()
    ref = read_reference(code, {"width": 8})
    assert ref.fails_kind == "fails", ref
    with pytest.raises(Exception):  # noqa: B017 - torch raises ValueError, TypeError, KeyError or AssertionError
        eval(layer, {"nn": torch.nn, "torch": torch, "width": 8})


@pytest.mark.parametrize("call", ["add_module('a.b', nn.Linear(width, 2))", "add_module(7, nn.Linear(width, 2))",
                                  "add_module('z', 5)", "register_parameter('pq', torch.zeros(2))"])
def test_a_registration_torch_refuses_fails_as_torch_does(call: str) -> None:
    code = (HEAD + f"        self.{call}\n").encode()
    assert read_reference(code, {"width": 8}).fails_kind == "fails"
    with pytest.raises((KeyError, TypeError)):
        eval(f"m.{call}", {"m": torch.nn.Module(), "nn": torch.nn, "torch": torch, "width": 8})


_TAKEN_NAMES = [
    "self.d = nn.ModuleDict({'keys': nn.Linear(width, 2), 'values': nn.Linear(width, 2)})\n",
    "self.d = nn.ModuleDict({'training': nn.Linear(width, 2)})\n",
    "self.d = nn.ModuleDict()\n        self.d['items'] = nn.Linear(width, 2)\n",
    "self.d = nn.ModuleDict()\n        self.d['a.b'] = nn.Linear(width, 2)\n",
    "self.d = nn.ModuleDict()\n        self.d['x'] = 3\n",
    "from collections import OrderedDict\n        self.s = nn.Sequential(OrderedDict([('append', nn.Linear(width, 2))]))\n",
    "self.add_module('forward', nn.Linear(width, 2))\n",
    "self.register_parameter('cuda', nn.Parameter(torch.zeros(2)))\n",
    "self.register_buffer('half', torch.zeros(2))\n",
    "self.w = 3\n        self.add_module('w', nn.Linear(width, 2))\n",
    "self.l = nn.ModuleList()\n        self.l.add_module('extend', nn.Linear(width, 2))\n",
]


@pytest.mark.parametrize("body", _TAKEN_NAMES)
def test_a_child_named_as_an_attribute_torch_has_fails_as_torch_does(tmp_path: Path, body: str) -> None:
    """add_module refuses a name hasattr finds (a ModuleDict's 'keys', a Module's 'training' or 'forward', a
    plain attribute set before): KeyError at construction, so the head cannot be built; never an OK."""
    code = HEAD + "        " + body
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {"width": 8})
    assert ref.fails_kind == "fails", ref
    with pytest.raises((KeyError, TypeError)):
        _torch_state(path, {"width": 8})


@pytest.mark.parametrize("body", [
    "self.d = nn.ModuleDict({'key': nn.Linear(width, 2), 'value': nn.Linear(width, 2), 'proj': nn.Linear(2, 2)})\n",
    "self.d = nn.ModuleDict({'x': nn.Linear(width, 2)})\n        self.d['x'] = nn.Linear(width, 3)\n",
    "self.add_module('mlp', nn.Linear(width, 2))\n        self.add_module('mlp', nn.Linear(width, 4))\n",
    "self.d = nn.ModuleDict(modules={'q': nn.Linear(width, 2)})\n        self.l = nn.ModuleList(modules=[nn.Linear(2, 3)])\n",
    "self.d = nn.ModuleDict(None)\n        self.l = nn.ModuleList(None)\n",
    "self.b = nn.Linear(int(' 4 '), int(8.0))\n",
])
def test_a_child_name_torch_takes_is_read(tmp_path: Path, body: str) -> None:
    code = HEAD + "        " + body
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {"width": 8})
    assert (ref.status, ref.unknown, ref.reason) == ("ok", (), ""), ref
    assert ref.tensors == _torch_state(path, {"width": 8})


@pytest.mark.parametrize("source", [
    b"\xef\xbb\xbfx = 1\n",  # a UTF-8 BOM
    b"# -*- coding: latin-1 -*-\n# caf\xe9\nx = 1\n",  # a coding cookie and a byte in that codec
    b"x = 1\r\ny = 2\r\n",
    b"# -*- coding: bogus -*-\nx = 1\n",
    b"\xef\xbb\xbf# coding: latin-1\nx = 1\n",
    b"x = 1\n# \xff\n",
    b"x = '\xff'\n",
])
def test_a_source_is_decoded_as_python_imports_it(tmp_path: Path, source: bytes) -> None:
    """A file Python imports is read (a BOM, a coding cookie); one Python cannot decode is invalid."""
    from clef_format.spec.head_reference import parse_source

    path = tmp_path / "enc_case.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("enc_case", path)
    assert spec is not None and spec.loader is not None
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        imports = True
    except SyntaxError:
        imports = False
    tree, why = parse_source(source)
    assert (tree is not None) == imports, why
    assert imports or why.startswith("invalid: ")


def test_an_int_conversion_python_refuses_fails_as_it_does(tmp_path: Path) -> None:
    code = HEAD + "        self.b = nn.Linear(int('4.0'), 2)\n"
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    assert read_reference(code.encode(), {"width": 8}).fails_kind == "fails"
    with pytest.raises(ValueError):
        _torch_state(path, {"width": 8})


@pytest.mark.parametrize("body", [
    "self.p = nn.Parameter(torch.zeros(2, dtype=torch.long))\n",
    "self.p = nn.Parameter(torch.arange(width))\n",
    "self.p = nn.Parameter(torch.tensor([[1, 2], [3, 4]]))\n",
    "self.p = nn.Parameter(torch.tensor([True, False]))\n",
    "self.p = nn.Parameter(torch.full((width,), 3))\n",
    "self.p = nn.Parameter(torch.ones(width, dtype=torch.int8), True)\n",
    "self.p = nn.Parameter(data=torch.empty(2, dtype=torch.bool))\n",
])
def test_an_integer_parameter_that_requires_grad_fails_as_torch_does(tmp_path: Path, body: str) -> None:
    """nn.Parameter requires grad by default, which only floating point tensors can: RuntimeError at
    construction, a head that cannot be built (it was read as a parameter of that shape)."""
    code = HEAD + "        " + body
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    assert read_reference(code.encode(), {"width": 8}).fails_kind == "fails"
    with pytest.raises(RuntimeError):
        _torch_state(path, {"width": 8})


@pytest.mark.parametrize("body", [
    "self.p = nn.Parameter(torch.zeros(2, dtype=torch.long), requires_grad=False)\n",
    "self.p = nn.Parameter(torch.arange(width), False)\n",
    "self.p = nn.Parameter(torch.tensor([1.0, 2]))\n        self.q = nn.Parameter(torch.tensor([]))\n",
    "self.p = nn.Parameter(torch.full((width,), 3.0))\n        self.q = nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))\n",
    "self.p = nn.Parameter(torch.arange(width, dtype=torch.float32))\n",
    "self.register_buffer('b', torch.arange(width))\n",
])
def test_a_parameter_torch_builds_is_read(tmp_path: Path, body: str) -> None:
    code = HEAD + "        " + body
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {"width": 8})
    assert (ref.status, ref.unknown, ref.reason) == ("ok", (), ""), ref
    assert ref.tensors == _torch_state(path, {"width": 8})


@pytest.mark.parametrize("body", [
    "assert width % 3 == 0, 'width must be a multiple of 3'\n        self.b = nn.Linear(width, 2)\n",
    "if width > 4:\n            raise ValueError('too wide')\n        self.b = nn.Linear(width, 2)\n",
    "self.w = nn.Parameter(torch.zeros(3))\n        self.w = torch.zeros(4)\n",
    "self.p = nn.Linear(width, 2)\n        self.p = 5\n",
    "self.b = nn.Parameter(torch.zeros(3))\n        self.b = 5\n",
    "self.p = nn.Linear(width, 2)\n        self.register_parameter('p', nn.Parameter(torch.zeros(3)))\n",
    "self.register_buffer('q', torch.zeros(3))\n        self.add_module('q', nn.Linear(width, 2))\n",
    "self.w = nn.Parameter(torch.zeros(3), requires_grad=None)\n",
    "self.w = nn.Parameter(torch.zeros(3, dtype=torch.int32), requires_grad=0)\n",
    "self.w = nn.Parameter(torch.zeros(3, dtype='float32'))\n",
    "self.l = nn.Linear(4, 4, dtype=torch.int8)\n",
    "self.e = nn.Embedding(4, 4, dtype=torch.long)\n",
])
def test_what_torch_raises_on_while_building_fails_as_it_does(tmp_path: Path, body: str) -> None:
    """A decided assert or raise, an assignment Module.__setattr__ refuses, a registration over a child of the
    other kind, requires_grad or dtype of the wrong type, a layer of an integer dtype: torch raises while
    building the head, so it cannot be built: a fact, never an OK."""
    code = HEAD + "        " + body
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {"width": 8})
    assert ref.fails_kind == "fails", ref
    with pytest.raises((AssertionError, ValueError, TypeError, KeyError, RuntimeError)):
        _torch_state(path, {"width": 8})


@pytest.mark.parametrize("body", [
    "assert width % 2 == 0\n        self.b = nn.Linear(width, 2)\n",
    "if width > 16:\n            raise ValueError('too wide')\n        self.b = nn.Linear(width, 2)\n",
    "self.register_buffer('b', torch.zeros(3))\n        self.b = torch.ones(5)\n",
    "self.p = nn.Linear(width, 2)\n        self.p = None\n        self.q = nn.Linear(2, 2)\n",
])
def test_what_torch_builds_is_read_so(tmp_path: Path, body: str) -> None:
    code = HEAD + "        " + body
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {"width": 8})
    assert (ref.status, ref.unknown, ref.reason, ref.fails) == ("ok", (), "", ""), ref
    assert ref.tensors == _torch_state(path, {"width": 8})


@pytest.mark.parametrize("method", ["register_buffer", "add_module", "state_dict", "_save_to_state_dict"])
def test_a_head_with_its_own_registration_or_state_dict_is_not_read(method: str) -> None:
    """A class that overrides how children register or what the state_dict holds: what torch's own methods
    would give is not what it builds, so the reader decides nothing (the facts judge the head)."""
    code = HEAD.replace("    def __init__", f"    def {method}(self, *a, **k):\n        return None\n\n    def __init__") \
        + "        self.register_buffer('b', torch.zeros(3))\n"
    ref = read_reference(code.encode(), {"width": 8})
    assert ref.status == "unread" and method in ref.reason


def test_a_dotted_child_name_builds_but_never_loads(tmp_path: Path) -> None:
    """setattr(self, "a.b", module): torch builds it, and load_state_dict of its own state_dict fails."""
    code = HEAD + "        setattr(self, 'a.b', nn.Linear(width, 2))\n"
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    assert read_reference(code.encode(), {"width": 8}).fails_kind == "fails"
    spec = importlib.util.spec_from_file_location("dotted_head", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    head = module.JointSchemaHead(width=8)
    with pytest.raises(RuntimeError):
        head.load_state_dict(head.state_dict(), strict=True)


@pytest.mark.parametrize("signature, config", [
    ("self, width, **kw", {"width": 8, "self": 1}),
    ("self, width, /, **kw", {"width": 8}),
])
def test_a_config_the_signature_cannot_bind_fails_as_python_does(tmp_path: Path, signature: str, config: dict) -> None:
    code = HEAD.replace("def __init__(self, width):", f"def __init__({signature}):") \
        + "        self.b = nn.Linear(width, 2)\n"
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    assert read_reference(code.encode(), config).fails_kind in ("fails", "missing")
    with pytest.raises(TypeError):
        _torch_state(path, config)


def test_the_attribute_names_torch_refuses_are_torch_s_own() -> None:
    assert MODULE_ATTRS == set(dir(torch.nn.Module()))
    for kind, names in CONTAINER_ATTRS.items():
        assert names == set(dir(getattr(torch.nn, kind)())), kind


def test_a_float_head_count_is_not_decided_as_torch_builds_it() -> None:
    """torch's attention takes a float head count that divides the width; the reader does not guess."""
    code = (HEAD + "        self.a = nn.MultiheadAttention(width, 2.0)\n").encode()
    assert read_reference(code, {"width": 8}).fails == ""
    torch.nn.MultiheadAttention(8, 2.0, device="meta")


@pytest.mark.parametrize("layer", ["nn.RNN(width, 4, nonlinearity='sigmoid')", "nn.RNN(width, 4, proj_size=2)",
                                   "nn.ConvTranspose1d(width, 3, 2, groups=2)"])
def test_a_layer_torch_refuses_fails_as_torch_does(layer: str) -> None:
    """What torch's constructor raises on (an RNN nonlinearity it does not know, proj_size on a plain RNN,
    channels groups do not divide) is a head that fails to build, never a guessed shape."""
    code = (HEAD + f"        self.a = {layer}\n").encode()
    assert read_reference(code, {"width": 8}).fails_kind == "fails"
    with pytest.raises(ValueError):
        eval(layer, {"nn": torch.nn, "width": 8})


# ---- hostile files: never run, never a crash
def _marker_code(marker: Path) -> str:
    return f"open({str(marker)!r}, 'w').write('ran')"


def _hostile(marker: Path) -> dict[str, bytes]:
    run = _marker_code(marker)
    return {
        "top-level": f"import os\nos.system('touch {marker}')\n{run}\n{HEAD}        self.a = nn.Linear(2, 2)\n".encode(),
        "in-init": (HEAD + f"        import os\n        os.system('touch {marker}')\n        {run}\n").encode(),
        "class-body": f"import torch\nclass JointSchemaHead:\n    {run}\n    def __init__(self, width): pass\n".encode(),
        "default-arg": f"class JointSchemaHead:\n    def __init__(self, width=({run})): pass\n".encode(),
        "syntax-error": f"{run}\nclass JointSchemaHead(:\n".encode(),
        "huge": f"{run}\n".encode() + b"#" * (10 * 1024 * 1024),
        "deep-parens": f"{run}\nx = ".encode() + b"(" * 1000 + b"1" + b")" * 1000 + b"\n",
        "deep-lists": f"{run}\nx = ".encode() + b"[" * 1000 + b"]" * 1000 + b"\n",
        "deep-unary": f"{run}\nx = ".encode() + b"-" * 100_000 + b"1\n",
        "deep-blocks": (f"{run}\n" + "".join(" " * i + "if x:\n" for i in range(1000)) + " " * 1000 + "pass\n").encode(),
        "long-sum": (HEAD + "        self.a = nn.Linear(" + "+".join(["1"] * 500) + ", 2)\n").encode(),
        "self-recursion": (HEAD + "        self.a = JointSchemaHead(width)\n").encode(),
        "mutual-recursion": ("import torch\nfrom torch import nn\nclass A(nn.Module):\n    def __init__(self):\n"
                             "        super().__init__()\n        self.b = B()\n"
                             "class B(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
                             "        self.a = A()\n" + HEAD.split("\n\n", 1)[1] + "        self.x = A()\n").encode(),
        "huge-loop": (HEAD + "        for i in range(60000):\n            for j in range(60000):\n"
                      "                self.a = nn.Linear(i, j)\n").encode(),
        "huge-encoder": (HEAD + "        self.e = nn.TransformerEncoder(nn.TransformerEncoder(nn.TransformerEncoderLayer"
                         "(8, 2), 100), 600)\n").encode(),
        "huge-encoders": (HEAD + "        e = nn.Sequential(*[nn.Linear(2, 2) for _ in range(300)])\n        self.l = "
                          "nn.ModuleList([nn.TransformerEncoder(e, 20) for _ in range(1000)])\n").encode(),
        "huge-rnn": (HEAD + "        self.g = nn.LSTM(4, 4, 30000, bidirectional=True)\n").encode(),
        "null-bytes": b"class JointSchemaHead:\x00\n",
        "not-utf8": b"\xff\xfe\x00class",
        "no-class": f"{run}\n".encode(),
    }


@pytest.mark.parametrize("case", list(_hostile(Path("/x"))))
def test_a_hostile_reference_is_never_run_and_never_crashes(tmp_path: Path, case: str) -> None:
    marker = tmp_path / "ran"
    source = _hostile(marker)[case]
    ref = read_reference(source, {"width": 8})
    assert not marker.exists()
    assert ref.status in ("ok", "invalid", "unread")
    if case in ("syntax-error", "null-bytes", "not-utf8", "deep-parens", "deep-lists", "deep-blocks"):
        assert ref.status == "invalid", ref
    if case in ("huge",):
        assert ref.status == "unread" and str(MAX_SOURCE_BYTES) in ref.reason
    if case in ("self-recursion", "mutual-recursion", "huge-loop", "long-sum", "huge-encoder", "huge-encoders",
                "huge-rnn"):
        assert ref.status == "ok" and ref.unknown, ref


# ---- a file that changes what its names resolve to is not read (torch would build something else)
_MY_NORM = "class LayerNorm(nn.Module):\n    def __init__(self, w):\n        super().__init__()\n" \
           "        self.g = nn.Parameter(torch.ones(w, 2))\n\n"
_HEAD_CLASS = "class JointSchemaHead(nn.Module):\n    def __init__(self, width):\n        super().__init__()\n" \
              "        self.a = nn.LayerNorm(width)\n"
_IMPORTS = "import torch\nfrom torch import nn\nimport torch.nn\n"


@pytest.mark.parametrize("patch", [
    "nn.LayerNorm = LayerNorm\n",
    "torch.nn.LayerNorm = LayerNorm\n",
    "setattr(nn, 'LayerNorm', LayerNorm)\n",
    "setattr(torch.nn, 'LayerNorm', LayerNorm)\n",
    "globals()['nn'].LayerNorm = LayerNorm\n",
    "m = nn\nm.LayerNorm = LayerNorm\n",
    "def patch():\n    nn.LayerNorm = LayerNorm\npatch()\n",
    "nn.__dict__['LayerNorm'] = LayerNorm\n",
    "vars(nn)['LayerNorm'] = LayerNorm\n",
    "def patch(c):\n    getattr(nn, '__setattr__')('LayerNorm', c)\n    return c\n@patch\nclass _N(LayerNorm):\n    pass\n",
])
def test_a_file_that_patches_torch_is_not_read(tmp_path: Path, patch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.nn, "LayerNorm", torch.nn.LayerNorm)  # torch's own again after the file patched it
    code = _IMPORTS + _MY_NORM + patch + "\n" + _HEAD_CLASS
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    assert _torch_state(path, {"width": 8}) == {"a.g": (8, 2)}  # torch builds the file's own norm
    ref = read_reference(code.encode(), {"width": 8})
    assert ref.status == "unread" and "line " in ref.reason, ref


@pytest.mark.parametrize("code", [
    "import torch\nfrom torch import nn\nfrom torch.nn import LayerNorm\n" + _MY_NORM.replace("class LayerNorm", "class Mine")
    + "LayerNorm = Mine\n" + _HEAD_CLASS.replace("nn.LayerNorm", "LayerNorm"),
    "import torch\nfrom torch import nn\n" + _MY_NORM.replace("class LayerNorm", "class Mine")
    + "import torch.nn as nn2\nnn2 = None\nclass nn:\n    Module = torch.nn.Module\n    LayerNorm = Mine\n" + _HEAD_CLASS,
    "import torch\nfrom torch import nn\n" + _MY_NORM.replace("class LayerNorm", "class Mine")
    + "def f():\n    global nn\n    nn = None\n" + _HEAD_CLASS,
    "import torch\nfrom torch import nn\ndef round(x):\n    return 99\n"
    + _HEAD_CLASS.replace("nn.LayerNorm(width)", "nn.Linear(round(2.5), 2)"),
    "import torch\nfrom torch import nn\nfrom os.path import *\n" + _HEAD_CLASS,
])
def test_a_file_that_rebinds_a_name_the_reader_resolves_is_not_read(tmp_path: Path, code: str) -> None:
    ref = read_reference(code.encode(), {"width": 8})
    assert ref.status == "unread" and "line " in ref.reason, ref


def test_an_untampered_file_with_its_own_norm_class_is_read(tmp_path: Path) -> None:
    code = _IMPORTS + _MY_NORM + _HEAD_CLASS.replace("nn.LayerNorm", "LayerNorm")
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {"width": 8})
    assert ref.status == "ok" and ref.tensors == _torch_state(path, {"width": 8}) == {"a.g": (8, 2)}


# ---- del / delattr, and the plain Python the reader follows (torch is the oracle)
@pytest.mark.parametrize("body", [
    "self.a = nn.Linear(width, 2)\n        self.b = nn.Linear(2, 2)\n        del self.a\n",
    "self.a = nn.Linear(width, 2)\n        self.b = nn.Linear(2, 2)\n        delattr(self, 'a')\n",
    "self.a = nn.Linear(width, 2)\n        self.n = 3\n        del self.n\n        self.b = nn.Linear(2, 2)\n",
    "self.b = nn.Linear(round(2.5), abs(-2))\n",
    "self.b = nn.Linear([width, 3][1], {'k': width}['k'])\n",
    "self.b = nn.Linear(True + 1, (width, 4)[-1])\n",
    "self.add_module('-'.join(['x', 'y']), nn.Linear(width, 2))\n        self.add_module('a'.upper(), nn.Linear(2, 2))\n",
    "self.add_module('p_{}'.format(width), nn.Linear(width, 2))\n        self.add_module('Q'.lower(), nn.Linear(2, 2))\n",
    "self.l = nn.ModuleList()\n        for i in range(5):\n            if i == 1:\n                continue\n"
    "            if i == 4:\n                break\n            self.l.append(nn.Linear(width, i + 1))\n",
    "self.l = nn.ModuleList([nn.Linear(2, 2)])\n        self.l.insert(0, nn.Linear(width, 3))\n"
    "        self.l.extend([nn.Linear(3, 3)])\n        self.l[1] = nn.Linear(5, 5)\n",
    "from collections import OrderedDict\n        self.s = nn.Sequential(OrderedDict([('fc', nn.Linear(width, 2)), "
    "('act', nn.GELU())]))\n        self.d = nn.ModuleDict(dict(x=nn.Linear(2, 2)))\n        self.d['y'] = nn.Linear(3, 3)\n",
    "import torch.nn as tnn\n        self.b = tnn.Linear(width, 2)\n",
    "self.b = self.format(width)\n\n    def format(self, w):\n        return nn.Linear(w, 3)\n",
    # an undecided if that only logs, and an initializer given to apply: names and shapes stay
    "if torch.cuda.is_available():\n            print('on a GPU')\n        self.b = nn.Linear(width, 2)\n",
    # statements torch's tree does not depend on: printed, logged, warned, seeded
    "print('building head', width)\n        self.b = nn.Linear(width, 2)\n",
    "import logging\n        logging.getLogger(__name__).info('width %d', width)\n        self.b = nn.Linear(width, 2)\n",
    "import warnings\n        warnings.warn(f'width {width}', stacklevel=2)\n        torch.manual_seed(0)\n"
    "        self.b = nn.Linear(width, 2)\n",
    "self.b = nn.Linear(width, 2)\n        n = width * 2\n        print(n, (n, 'x'), nn.Linear)\n"
    "        self.c = nn.Linear(n, 2)\n",
    "self.b = nn.Linear(width, 2)\n        self.apply(self._init)\n\n    def _init(self, m):\n"
    "        if isinstance(m, nn.Linear):\n            nn.init.zeros_(m.weight)\n",
    # `or` / `and` give an operand, not a bool (Python's own short-circuit)
    "self.a = nn.Linear(width, width * (0 or 2))\n        self.b = nn.Linear(None or width, width and 16)\n",
    "self.a = nn.Linear(width, 0 and width or 3)\n        self.b = nn.Linear(width or 1 / 0, 2)\n",
    # what torch's constructors accept at their edges
    "self.e = nn.Embedding(5, width, padding_idx=-5)\n        self.d = nn.Dropout(1)\n"
    "        self.t = nn.TransformerEncoderLayer(width, 2, 16, dropout=0.0, activation='gelu')\n",
    # an activation that is a module is the layer's child "activation", its parameters in the state_dict
    "self.e = nn.TransformerEncoderLayer(width, 2, 16, activation=nn.Linear(16, 16))\n"
    "        self.d = nn.TransformerDecoder(nn.TransformerDecoderLayer(width, 2, 16, activation=nn.LayerNorm(16)), 2)\n"
    "        self.t = nn.Transformer(width, 2, 1, 1, 16, activation=nn.Linear(16, 16))\n",
    # an in-place op returns its receiver: the module, the parameter
    "self.a = nn.Linear(width, width).requires_grad_(False)\n"
    "        self.p = nn.Parameter(torch.zeros(width)).requires_grad_(False)\n",
])
def test_the_reader_follows_plain_python_as_torch_runs_it(tmp_path: Path, body: str) -> None:
    code = HEAD + "        " + body
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {"width": 8})
    assert (ref.status, ref.unknown, ref.reason) == ("ok", (), ""), ref
    assert ref.tensors == _torch_state(path, {"width": 8})


_FUNCTIONS = ("def f0(w):\n    return nn.Linear(w, w)\n\ndef f1(w, depth=2):\n    return nn.Sequential(*[f0(w) for _ in "
              "range(depth)])\n\ndef grow(blocks, w):\n    blocks.append(nn.LayerNorm(w))\n    return None\n\n")


@pytest.mark.parametrize("body", [
    "self.x = f0(width)\n",
    "self.x = f1(width, depth=3)\n        self.y = f1(2)\n",
    "self.l = nn.ModuleList([f0(width)])\n        grow(self.l, width)\n",
])
def test_module_level_functions_are_followed_as_torch_runs_them(tmp_path: Path, body: str) -> None:
    code = HEAD.replace("\nclass ", "\n" + _FUNCTIONS + "class ", 1) + "        " + body
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {"width": 8})
    assert (ref.status, ref.unknown, ref.reason) == ("ok", (), ""), ref
    assert ref.tensors == _torch_state(path, {"width": 8})


def test_a_function_the_reader_cannot_follow_is_an_unknown_subtree_named_by_line() -> None:
    code = HEAD.replace("\nclass ", "\ndef f0(w):\n    return nn.Bilinear(w, w, w)\n\n\nclass ", 1) + \
        "        self.a = nn.Linear(width, 2)\n        self.x = f0(width)\n"
    ref = read_reference(code.encode(), {"width": 8})
    assert (ref.unknown, ref.why, ref.reason) == (("x",), ("line 5: torch.nn.Bilinear",), ""), ref


def test_a_head_taking_kwargs_is_read_from_them(tmp_path: Path) -> None:
    code = ("import torch\nfrom torch import nn\n\nclass JointSchemaHead(nn.Module):\n    def __init__(self, **cfg):\n"
            "        super().__init__()\n        self.a = nn.Linear(cfg['width'], cfg.get('out', 3))\n"
            "        self.b = nn.Linear(cfg.get('width'), 2)\n")
    path = tmp_path / "joint_schema_model.py"
    path.write_text(code)
    ref = read_reference(code.encode(), {"width": 8, "heads": 2})
    assert (ref.status, ref.unknown, ref.rejected) == ("ok", (), ())
    assert ref.tensors == _torch_state(path, {"width": 8, "heads": 2})


def test_where_the_reader_stops_is_named_by_line_and_construct() -> None:
    code = HEAD + "        self.a = nn.Linear(width, 2)\n        while True:\n            pass\n"
    ref = read_reference(code.encode(), {"width": 8})
    assert ref.unknown == ("",) and ref.reason == "read up to line 8: While", ref


@pytest.mark.parametrize("index", [-1, 5])
def test_a_modulelist_insert_torch_does_not_renumber_like_a_list_is_not_guessed(index: int) -> None:
    code = HEAD + f"        self.l = nn.ModuleList([nn.Linear(2, 2)])\n        self.l.insert({index}, nn.Linear(width, 3))\n"
    ref = read_reference(code.encode(), {"width": 8})
    assert ref.unknown == ("",), ref
