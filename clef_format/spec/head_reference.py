"""The joint head's tensors as the checkpoint's own ``joint_schema_model.py`` defines them, read statically.

Every Clef checkpoint ships the reference code that builds its head (``JointSchemaHead(**config)``).
What it defines is a fact about that checkpoint; the names this project infers are not. So the head
check reads the module tree ``JointSchemaHead.__init__`` builds from the file's syntax tree (``ast``):
the file is never imported and never executed. A bounded evaluator follows assignments to ``self``,
arithmetic over the config and earlier locals, ``for`` loops and comprehensions over ``range``,
``if``s it can decide, the file's own module classes (their ``super().__init__``, their methods called
on ``self``), the file's module-level functions, initializers that only change values (``nn.init.*``,
``.zero_()``), and torch's own layer classes, whose parameter names and shapes it knows (``TORCH_PARAMS``:
the same names and shapes ``torch.nn`` gives them, checked against real torch in the tests). Statements
that cannot change the module tree (``print(...)``, ``logger.info(...)``: ``_inert``) are skipped when it
cannot evaluate them. Anything else is *unknown* for the subtree it builds, never guessed, and named with
the line and construct it came from (``Reference.why``): the checks fall back to facts for that part.
"""

from __future__ import annotations

# The C module's node classes (``ast`` re-exports them): ``ast.py`` itself (walk, parse, unparse) and the
# contextlib it pulls in cost about 1.6 ms of verify's start on the 2-core VM (-X importtime), more than
# the walk and parse below, which need only the node classes and ``compile``.
import _ast as ast
import math

from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

#: The class the reference code defines and the plugin builds with ``JointSchemaHead(**config)``.
HEAD_CLASS = "JointSchemaHead"
#: Bigger reference files are not parsed (the release's is a few kB): reported, then the facts decide.
MAX_SOURCE_BYTES = 1024 * 1024
#: Evaluation bounds: steps (nodes evaluated), nesting of the evaluator, class instantiations, list sizes.
MAX_STEPS = 200_000
MAX_DEPTH = 60
MAX_ITEMS = 65_536
MAX_INT = 2**62


class Reference(Record):
    """What the reader made of a reference file.

    ``status``: ``ok`` (read; ``tensors`` are exact outside the ``unknown`` subtrees), ``invalid`` (not
    valid Python: the engine's import of it fails too), ``unread`` (over the limits, or no
    ``JointSchemaHead`` class the reader can follow: nothing is known from it). ``unknown`` holds the
    module paths (``""``: the whole head) whose tensors the reader could not tell. ``fails``: why
    ``JointSchemaHead(**config)`` itself would raise (a key it does not take, a required argument the
    config lacks, a torch class's own assertion), or ""; ``fails_kind``: ``missing`` or ``fails``. The
    keys it does not take are ``rejected``; the head is read without them.
    """

    status: str
    reason: str = ""
    tensors: dict = {}  # name -> shape
    unknown: tuple = ()
    fails: str = ""
    fails_kind: str = ""
    rejected: tuple = ()  # config keys JointSchemaHead.__init__ does not take (a TypeError in the real call)
    why: tuple = ()  # for each path of ``unknown`` (same order): ``line N: construct`` where the reader stopped


class _Unknown(Exception):
    """A value or statement the reader cannot evaluate; ``line``: the innermost statement it stopped at."""

    line: int | None = None


class _Break(Exception):
    """A ``break`` in a loop the reader follows."""


class _Continue(Exception):
    """A ``continue`` in a loop the reader follows."""


class _Return(Exception):
    """A ``return`` in a method the reader follows."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value


class _Fails(Exception):
    """Something the real constructor would raise on (an assertion of a torch class): a fact."""


class _Module:
    """A module of the tree: ordered children (modules, parameter shapes, or ``_UNKNOWN``)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.children: dict[str, Any] = {}
        self.attrs: dict[str, Any] = {}  # plain values set on self (ints, tuples...), readable later
        self.why: dict[str, str] = {}  # child name -> "line N: construct" where an unknown child came from


class _Param:
    """A tensor of the state_dict: a parameter, or with ``buffer`` a persistent buffer."""

    def __init__(self, shape: tuple[int, ...], buffer: bool = False) -> None:
        self.shape = shape
        self.buffer = buffer


class _TensorVal:
    """A plain tensor value (``torch.zeros(...)``): a parameter once wrapped in ``nn.Parameter``.
    ``floating``: whether its dtype can require gradients (floating point), False for integer and bool
    dtypes, None when the reader does not know."""

    def __init__(self, shape: tuple[int, ...], floating: bool | None = None) -> None:
        self.shape = shape
        self.floating = floating


#: torch's dtypes by name (``torch.long``...) whose tensors can / cannot require gradients (torch 2.13:
#: ``is_floating_point``; integers and bool cannot, so ``nn.Parameter`` of one raises RuntimeError).
_FLOAT_DTYPES = frozenset({"float16", "half", "bfloat16", "float32", "float", "float64", "double"})
_INTEGER_DTYPES = frozenset({"bool", "uint8", "int8", "int16", "short", "int32", "int", "int64", "long", "uint16",
                             "uint32", "uint64"})


class _Ref:
    """A reference to a class, function or module by its dotted name (``torch.nn.Linear``)."""

    def __init__(self, path: str) -> None:
        self.path = path


_UNKNOWN = object()

#: Python's builtins the reader resolves by name (a file binding one of them at module level is not read).
_BUILTINS = ("range", "len", "int", "max", "min", "super", "tuple", "list", "setattr", "True", "False", "None",
             "dict", "round", "abs", "delattr", "enumerate", "zip")

#: Methods of plain values (str, dict) the reader follows, and ``insert`` of lists and ModuleLists.
_VALUE_METHODS = ("get", "upper", "lower", "join", "format", "insert")

_NO_PARAMS = {"GELU", "ReLU", "SiLU", "Tanh", "Sigmoid", "Dropout", "Identity", "Softmax", "Flatten", "Mish",
              "LeakyReLU", "ELU", "Softplus", "Hardswish", "Dropout1d", "Dropout2d", "LogSoftmax"}


def _dim(v: Any) -> int:
    """A size torch allocates a tensor with: a float or a negative int is torch's own error
    (``torch.empty`` raises TypeError / RuntimeError), so the head cannot be built: a fact. Anything
    else that is not an int (a bool, whose treatment varies by position, or a value the reader lost)
    is not decided."""
    if isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool) and v < 0):
        raise _Fails(f"{v!r} is not a tensor size (torch.empty raises on it)")
    return _count(v)


def _count(v: Any) -> int:
    """A non-negative int that is not itself a tensor size (a head count, a number of layers): anything
    else is not decided (torch accepts a float head count, and builds no layer for a negative count)."""
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise _Unknown(f"not a dimension: {v!r}")
    return v


#: What ``hasattr`` finds on a fresh ``torch.nn.Module`` (torch 2.13, Python 3.11: ``dir(nn.Module())``), and
#: each container's own additions. ``add_module`` (and so ``ModuleDict({...})``, ``md[key] = m``,
#: ``Sequential(OrderedDict(...))``, ``register_parameter``, ``register_buffer``) refuses a name ``hasattr``
#: finds that is not already its kind of child: KeyError "attribute 'keys' already exists".
#: tests/spec/test_head_reference.py compares these with torch's own ``dir()``.
MODULE_ATTRS = frozenset({
    'T_destination', '__annotations__', '__call__', '__class__', '__delattr__', '__dict__', '__dir__', '__doc__',
    '__eq__', '__format__', '__ge__', '__getattr__', '__getattribute__', '__getstate__', '__gt__', '__hash__',
    '__init__', '__init_subclass__', '__le__', '__lt__', '__module__', '__ne__', '__new__', '__reduce__',
    '__reduce_ex__', '__repr__', '__setattr__', '__setstate__', '__sizeof__', '__str__', '__subclasshook__',
    '__weakref__', '_apply', '_backward_hooks', '_backward_pre_hooks', '_buffers', '_call_impl',
    '_compiled_call_impl', '_forward_hooks', '_forward_hooks_always_called', '_forward_hooks_with_kwargs',
    '_forward_pre_hooks', '_forward_pre_hooks_with_kwargs', '_get_backward_hooks', '_get_backward_pre_hooks',
    '_get_name', '_is_full_backward_hook', '_load_from_state_dict', '_load_state_dict_post_hooks',
    '_load_state_dict_pre_hooks', '_maybe_warn_non_full_backward_hook', '_modules', '_named_members',
    '_non_persistent_buffers_set', '_parameters', '_register_load_state_dict_pre_hook', '_register_state_dict_hook',
    '_replicate_for_data_parallel', '_save_to_state_dict', '_slow_forward', '_state_dict_hooks',
    '_state_dict_pre_hooks', '_version', '_wrapped_call_impl', 'add_module', 'apply', 'bfloat16', 'buffers',
    'call_super_init', 'children', 'compile', 'cpu', 'cuda', 'double', 'dump_patches', 'eval', 'extra_repr', 'float',
    'forward', 'get_buffer', 'get_extra_state', 'get_parameter', 'get_submodule', 'half', 'ipu', 'load_state_dict',
    'modules', 'mtia', 'named_buffers', 'named_children', 'named_modules', 'named_parameters', 'parameters',
    'register_backward_hook', 'register_buffer', 'register_forward_hook', 'register_forward_pre_hook',
    'register_full_backward_hook', 'register_full_backward_pre_hook', 'register_load_state_dict_post_hook',
    'register_load_state_dict_pre_hook', 'register_module', 'register_parameter', 'register_state_dict_post_hook',
    'register_state_dict_pre_hook', 'requires_grad_', 'set_extra_state', 'set_submodule', 'share_memory',
    'state_dict', 'to', 'to_empty', 'train', 'training', 'type', 'xpu', 'zero_grad',
})
CONTAINER_ATTRS = {
    "ModuleDict": MODULE_ATTRS | frozenset({
        '__contains__', '__delitem__', '__getitem__', '__iter__', '__len__', '__setitem__', 'clear', 'items', 'keys',
        'pop', 'update', 'values',
    }),
    "ModuleList": MODULE_ATTRS | frozenset({
        '__add__', '__delitem__', '__getitem__', '__iadd__', '__iter__', '__len__', '__setitem__',
        '_get_abs_string_index', 'append', 'extend', 'insert', 'pop',
    }),
    "Sequential": MODULE_ATTRS | frozenset({
        '__add__', '__delitem__', '__getitem__', '__iadd__', '__imul__', '__iter__', '__len__', '__mul__',
        '__rmul__', '__setitem__', '_get_item_by_idx', 'append', 'extend', 'insert', 'pop',
    }),
}


def _module_name(key: Any, where: str, owner: _Module | None = None, tensor: bool = False) -> str:
    """A child's name as ``add_module`` takes it: a string without a dot, not empty, and, given the
    ``owner`` module it goes into, no attribute of it other than a child of the same kind already there
    (a module for ``add_module``, a tensor for ``register_parameter`` / ``register_buffer``, ``tensor``);
    torch raises TypeError / KeyError otherwise."""
    if not isinstance(key, str):
        raise _Fails(f"{where}: module name should be a string, got {type(key).__name__}")
    if "." in key or not key:
        raise _Fails(f"{where}: module name can't contain \".\" or be empty, got {key!r}")
    if owner is not None and key not in owner.children and (
            key in CONTAINER_ATTRS.get(owner.kind, MODULE_ATTRS) or key in owner.attrs):
        raise _Fails(f"{where}: attribute {key!r} already exists (torch's add_module raises KeyError)")
    other = _Module if tensor else _Param
    if owner is not None and isinstance(owner.children.get(key), other):
        raise _Fails(f"{where}: attribute {key!r} already exists as a {'module' if tensor else 'tensor'} "
                     "(torch raises KeyError)")
    return key


def _linear(a: dict[str, Any]) -> dict[str, Any]:
    i, o = _dim(a["in_features"]), _dim(a["out_features"])
    out: dict[str, Any] = {"weight": _Param((o, i))}
    if a["bias"]:
        out["bias"] = _Param((o,))
    return out


def _norm_shape(v: Any) -> tuple[int, ...]:
    if isinstance(v, (tuple, list)):
        return tuple(_dim(x) for x in v)
    return (_dim(v),)


def _layer_norm(a: dict[str, Any]) -> dict[str, Any]:
    shape = _norm_shape(a["normalized_shape"])
    if not a["elementwise_affine"]:
        return {}
    return {"weight": _Param(shape), **({"bias": _Param(shape)} if a["bias"] else {})}


def _rms_norm(a: dict[str, Any]) -> dict[str, Any]:
    return {"weight": _Param(_norm_shape(a["normalized_shape"]))} if a["elementwise_affine"] else {}


def _probability(p: Any, who: str) -> None:
    """torch's own check of a dropout probability (``nn.Dropout``, the transformer layers, the RNNs): a
    number in [0, 1], else ValueError (a string cannot be compared: TypeError). A value the reader
    lost is not decided."""
    if p is None or isinstance(p, (str, list, tuple, dict)) or (isinstance(p, (int, float)) and not 0 <= p <= 1):
        raise _Fails(f"{who}: dropout probability has to be between 0 and 1, but got {p!r}")


def _embedding(a: dict[str, Any]) -> dict[str, Any]:
    n, pad = _dim(a["num_embeddings"]), a["padding_idx"]
    if isinstance(pad, (float, str, list, tuple, dict)):
        raise _Fails(f"Embedding({n}, ...): padding_idx {pad!r} is not an index (torch raises on it)")
    if isinstance(pad, int) and not isinstance(pad, bool) and not -n <= pad < n:
        raise _Fails(f"Embedding({n}, ...): padding_idx {pad} must be within num_embeddings (torch asserts it)")
    return {"weight": _Param((n, _dim(a["embedding_dim"])))}


def _mha(a: dict[str, Any]) -> dict[str, Any]:
    e, h = _dim(a["embed_dim"]), _count(a["num_heads"])
    if h == 0 or e % h:
        raise _Fails(f"MultiheadAttention({e}, {h}): embed_dim must be divisible by num_heads")
    k = e if a["kdim"] is None else _dim(a["kdim"])
    v = e if a["vdim"] is None else _dim(a["vdim"])
    out: dict[str, Any] = {}
    if k == e and v == e:
        out["in_proj_weight"] = _Param((3 * e, e))
    else:
        out.update(q_proj_weight=_Param((e, e)), k_proj_weight=_Param((e, k)), v_proj_weight=_Param((e, v)))
    if a["bias"]:
        out["in_proj_bias"] = _Param((3 * e,))
    proj = _Module("NonDynamicallyQuantizableLinear")
    proj.children = {"weight": _Param((e, e)), **({"bias": _Param((e,))} if a["bias"] else {})}
    out["out_proj"] = proj
    if a["add_bias_kv"]:
        out["bias_k"], out["bias_v"] = _Param((1, 1, e)), _Param((1, 1, e))
    return out


def _transformer_layer(cross: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def build(a: dict[str, Any]) -> dict[str, Any]:
        d, ff, bias = _dim(a["d_model"]), _dim(a["dim_feedforward"]), a["bias"]
        _probability(a["dropout"], "TransformerLayer")
        if isinstance(a["activation"], str) and a["activation"] not in ("relu", "gelu"):
            raise _Fails(f"activation should be relu/gelu, not {a['activation']}")
        attn = {"embed_dim": d, "num_heads": a["nhead"], "bias": bias, "kdim": None, "vdim": None, "add_bias_kv": False}

        def sub(kind: str, children: dict[str, Any]) -> _Module:
            m = _Module(kind)
            m.children = children
            return m

        out: dict[str, Any] = {"self_attn": sub("MultiheadAttention", _mha(attn))}
        if cross:
            out["multihead_attn"] = sub("MultiheadAttention", _mha(attn))
        out["linear1"] = sub("Linear", _linear({"in_features": d, "out_features": ff, "bias": bias}))
        out["dropout"] = sub("Dropout", {})
        out["linear2"] = sub("Linear", _linear({"in_features": ff, "out_features": d, "bias": bias}))
        for n in range(1, 4 if cross else 3):
            out[f"norm{n}"] = sub("LayerNorm", _layer_norm({"normalized_shape": d, "elementwise_affine": True,
                                                            "bias": bias}))
        if isinstance(a["activation"], _Module):  # self.activation = activation: a module is a child
            out["activation"] = _clone(a["activation"])
        return out
    return build


def _conv(dims: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``nn.Conv{1,2,3}d``: weight [out, in / groups, *kernel], bias [out]; torch's own ValueErrors on groups."""
    def build(a: dict[str, Any]) -> dict[str, Any]:
        i, o, g, k = _dim(a["in_channels"]), _dim(a["out_channels"]), a["groups"], a["kernel_size"]
        if not isinstance(g, int) or isinstance(g, bool) or g <= 0:
            raise _Fails(f"Conv{dims}d: groups must be a positive integer")
        if i % g or o % g:
            raise _Fails(f"Conv{dims}d: in_channels and out_channels must be divisible by groups")
        kernel = tuple(_dim(x) for x in k) if isinstance(k, (tuple, list)) else (_dim(k),) * dims
        if len(kernel) != dims:
            raise _Unknown(f"Conv{dims}d kernel_size")
        return {"weight": _Param((o, i // g, *kernel)), **({"bias": _Param((o,))} if a["bias"] else {})}
    return build


def _conv_transpose(dims: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``nn.ConvTranspose{1,2,3}d``: weight [in, out / groups, *kernel] (in first: the transpose of a
    convolution's), bias [out]; torch's own ValueErrors on groups."""
    conv = _conv(dims)

    def build(a: dict[str, Any]) -> dict[str, Any]:
        out = conv(a)  # groups, kernel and bias checked and read as for the convolution
        kernel = out["weight"].shape[2:]
        return {**out, "weight": _Param((_dim(a["in_channels"]), _dim(a["out_channels"]) // a["groups"], *kernel))}
    return build


def _transformer(a: dict[str, Any]) -> dict[str, Any]:
    """``nn.Transformer``: ``encoder`` (num_encoder_layers encoder layers, then its LayerNorm ``norm``) and
    ``decoder`` (likewise), as torch builds them when no custom encoder or decoder is given."""
    if a["custom_encoder"] is not None or a["custom_decoder"] is not None:
        raise _Unknown("Transformer custom_encoder / custom_decoder")
    d = _dim(a["d_model"])
    layer_args = {"d_model": d, "nhead": a["nhead"], "dim_feedforward": a["dim_feedforward"], "bias": a["bias"],
                  "dropout": a["dropout"], "activation": a["activation"]}
    norm = {"normalized_shape": d, "elementwise_affine": True, "bias": a["bias"]}
    out: dict[str, Any] = {}
    for part, cross, count in (("encoder", False, a["num_encoder_layers"]), ("decoder", True, a["num_decoder_layers"])):
        layer = _Module("TransformerDecoderLayer" if cross else "TransformerEncoderLayer")
        layer.children = _transformer_layer(cross)(layer_args)
        norm_module = _Module("LayerNorm")
        norm_module.children = _layer_norm(norm)
        stack = _Module("TransformerDecoder" if cross else "TransformerEncoder")
        stack.children = _stack({"layer": layer, "num_layers": count, "norm": norm_module})
        out[part] = stack
    return out


def _clone(m: Any) -> Any:
    """``copy.deepcopy`` of a module as the reader holds it (parameters are shapes: shared safely)."""
    if not isinstance(m, _Module):
        return m
    out = _Module(m.kind)
    out.children = {k: _clone(v) for k, v in m.children.items()}
    out.attrs, out.why = dict(m.attrs), dict(m.why)
    return out


def _size(m: Any) -> int:
    """Nodes of a module tree (itself, its modules and parameters)."""
    return 1 + sum(_size(c) for c in m.children.values()) if isinstance(m, _Module) else 1


def _stack(a: dict[str, Any]) -> dict[str, Any]:
    """``nn.TransformerEncoder/Decoder(layer, num_layers, norm)``: ``layers`` holds num_layers deep copies of
    the layer (the layer given is not itself a child), then ``norm`` when given."""
    if isinstance(a["num_layers"], float):
        raise _Fails(f"num_layers {a['num_layers']!r} is not an int (range() raises on it)")
    layer, n, norm = a["layer"], _count(a["num_layers"]), a["norm"]
    if not isinstance(layer, _Module) or not (norm is None or isinstance(norm, _Module)):
        raise _Unknown("TransformerEncoder/Decoder layer")
    if n * _size(layer) > MAX_ITEMS:  # the copies are not evaluation steps: bound what they build
        raise _Unknown("num_layers")
    layers = _Module("ModuleList")
    layers.children = {str(i): _clone(layer) for i in range(n)}
    return {"layers": layers, **({"norm": norm} if norm is not None else {})}


def _rnn(gates: int) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """``nn.GRU`` (3 gates) / ``nn.LSTM`` (4): per layer and direction weight_ih/hh_l{k}[_reverse], biases,
    and for an LSTM with proj_size, weight_hr; torch's own ValueErrors on sizes."""
    def build(a: dict[str, Any]) -> dict[str, Any]:
        i, h, n, proj = _dim(a["input_size"]), a["hidden_size"], a["num_layers"], a["proj_size"]
        if isinstance(a["dropout"], bool):
            raise _Fails("RNN: dropout should be a number in range [0, 1], not a bool")
        _probability(a["dropout"], "RNN")
        for what, v in (("hidden_size", h), ("num_layers", n), ("proj_size", proj)):
            if isinstance(v, float):
                raise _Fails(f"{what} should be of type int, got float ({v!r})")
            if not isinstance(v, int) or isinstance(v, bool):
                raise _Unknown(what)
        if h <= 0 or n <= 0 or proj < 0:
            raise _Fails("hidden_size and num_layers must be positive, proj_size non-negative")
        if proj and (gates != 4 or proj >= h):
            raise _Fails("proj_size is only supported for LSTM, and must be smaller than hidden_size")
        real = proj or h
        dirs = 2 if a["bidirectional"] else 1
        if n * dirs * 5 > MAX_ITEMS:
            raise _Unknown("num_layers")
        out: dict[str, Any] = {}
        for layer in range(n):
            for d in range(dirs):
                sfx = f"_l{layer}{'_reverse' if d else ''}"
                size_in = i if layer == 0 else real * dirs
                out[f"weight_ih{sfx}"] = _Param((gates * h, size_in))
                out[f"weight_hh{sfx}"] = _Param((gates * h, real))
                if a["bias"]:
                    out[f"bias_ih{sfx}"] = _Param((gates * h,))
                    out[f"bias_hh{sfx}"] = _Param((gates * h,))
                if proj:
                    out[f"weight_hr{sfx}"] = _Param((proj, h))
        return out
    return build


_CONV_SIG = (("in_channels", None), ("out_channels", None), ("kernel_size", None), ("stride", 1), ("padding", 0),
             ("dilation", 1), ("groups", 1), ("bias", True), ("padding_mode", "zeros"), ("device", None),
             ("dtype", None))
_RNN_SIG = (("input_size", None), ("hidden_size", None), ("num_layers", 1), ("bias", True), ("batch_first", False),
            ("dropout", 0.0), ("bidirectional", False), ("proj_size", 0), ("device", None), ("dtype", None))

_TL_SIG = (("d_model", None), ("nhead", None), ("dim_feedforward", 2048), ("dropout", 0.1), ("activation", None),
           ("layer_norm_eps", 1e-5), ("batch_first", False), ("norm_first", False), ("bias", True),
           ("device", None), ("dtype", None))

_RNN_TANH_SIG = (("input_size", None), ("hidden_size", None), ("num_layers", 1), ("nonlinearity", "tanh"),
                 ("bias", True), ("batch_first", False), ("dropout", 0.0), ("bidirectional", False), ("device", None),
                 ("dtype", None))
_CONV_T_SIG = (("in_channels", None), ("out_channels", None), ("kernel_size", None), ("stride", 1), ("padding", 0),
               ("output_padding", 0), ("groups", 1), ("bias", True), ("dilation", 1), ("padding_mode", "zeros"),
               ("device", None), ("dtype", None))
_TRANSFORMER_SIG = (("d_model", 512), ("nhead", 8), ("num_encoder_layers", 6), ("num_decoder_layers", 6),
                    ("dim_feedforward", 2048), ("dropout", 0.1), ("activation", None), ("custom_encoder", None),
                    ("custom_decoder", None), ("layer_norm_eps", 1e-5), ("batch_first", False), ("norm_first", False),
                    ("bias", True), ("device", None), ("dtype", None))


def _plain_rnn(a: dict[str, Any]) -> dict[str, Any]:
    """``nn.RNN``: one gate; ``nonlinearity`` must be torch's "tanh" or "relu"."""
    if a["nonlinearity"] not in ("tanh", "relu"):
        raise _Fails(f"Unknown nonlinearity '{a['nonlinearity']}'. Select from 'tanh' or 'relu'.")
    return _rnn(1)({**a, "proj_size": 0})


#: torch.nn classes the reader knows: (signature as (name, default) pairs, children builder). A default of
#: ``None`` on a leading name that is not given is a missing argument (unknown, never guessed).
TORCH_PARAMS: dict[str, tuple[tuple[tuple[str, Any], ...], Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "Linear": ((("in_features", None), ("out_features", None), ("bias", True), ("device", None), ("dtype", None)),
               _linear),
    "LayerNorm": ((("normalized_shape", None), ("eps", 1e-5), ("elementwise_affine", True), ("bias", True),
                   ("device", None), ("dtype", None)), _layer_norm),
    "RMSNorm": ((("normalized_shape", None), ("eps", None), ("elementwise_affine", True), ("device", None),
                 ("dtype", None)), _rms_norm),
    "Embedding": ((("num_embeddings", None), ("embedding_dim", None), ("padding_idx", None), ("max_norm", None),
                   ("norm_type", 2.0), ("scale_grad_by_freq", False), ("sparse", False), ("_weight", None),
                   ("_freeze", False), ("device", None), ("dtype", None)), _embedding),
    "MultiheadAttention": ((("embed_dim", None), ("num_heads", None), ("dropout", 0.0), ("bias", True),
                            ("add_bias_kv", False), ("add_zero_attn", False), ("kdim", None), ("vdim", None),
                            ("batch_first", False), ("device", None), ("dtype", None)), _mha),
    "TransformerEncoderLayer": (_TL_SIG, _transformer_layer(cross=False)),
    "TransformerDecoderLayer": (_TL_SIG, _transformer_layer(cross=True)),
    "TransformerEncoder": ((("layer", None), ("num_layers", None), ("norm", None), ("enable_nested_tensor", True),
                            ("mask_check", True)), _stack),
    "TransformerDecoder": ((("layer", None), ("num_layers", None), ("norm", None)), _stack),
    "Conv1d": (_CONV_SIG, _conv(1)),
    "Conv2d": (_CONV_SIG, _conv(2)),
    "Conv3d": (_CONV_SIG, _conv(3)),
    "GRU": (_RNN_SIG, _rnn(3)),
    "LSTM": (_RNN_SIG, _rnn(4)),
    "RNN": (_RNN_TANH_SIG, _plain_rnn),
    "ConvTranspose1d": (_CONV_T_SIG, _conv_transpose(1)),
    "ConvTranspose2d": (_CONV_T_SIG, _conv_transpose(2)),
    "ConvTranspose3d": (_CONV_T_SIG, _conv_transpose(3)),
    "Transformer": (_TRANSFORMER_SIG, _transformer),
}
_REQUIRED = {"Linear": 2, "LayerNorm": 1, "RMSNorm": 1, "Embedding": 2, "MultiheadAttention": 2,
             "TransformerEncoderLayer": 2, "TransformerDecoderLayer": 2, "TransformerEncoder": 2,
             "TransformerDecoder": 2, "Conv1d": 3, "Conv2d": 3, "Conv3d": 3, "GRU": 2, "LSTM": 2, "RNN": 2,
             "ConvTranspose1d": 3, "ConvTranspose2d": 3, "ConvTranspose3d": 3, "Transformer": 0}
#: Keyword names of torch's signature that differ from the reader's (``encoder_layer`` -> ``layer``).
_KEYWORDS = {"TransformerEncoder": {"encoder_layer": "layer"}, "TransformerDecoder": {"decoder_layer": "layer"}}
_MATH_CONSTANTS = {"pi": math.pi, "e": math.e}
_MATH_FUNCTIONS = {"sqrt": math.sqrt, "log": math.log, "log2": math.log2, "exp": math.exp, "ceil": math.ceil,
                   "floor": math.floor}
#: In-place tensor methods (initialization): they change values, never names or shapes.
_IN_PLACE = {"zero_", "fill_", "normal_", "uniform_", "copy_", "mul_", "add_", "clamp_", "requires_grad_",
             "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "orthogonal_", "xavier_uniform_",
             "xavier_normal_", "kaiming_uniform_", "kaiming_normal_"}
_TENSOR_MAKERS = {"zeros", "ones", "empty", "randn", "rand", "full", "arange"}


def _torch_name(path: str) -> str | None:
    """``torch.nn.Linear`` / ``torch.nn.modules.linear.Linear`` -> ``Linear``; None when not torch.nn."""
    parts = path.split(".")
    if len(parts) >= 3 and parts[0] == "torch" and parts[1] == "nn":
        return parts[-1]
    return None


class _Reader:
    def __init__(self, tree: ast.Module) -> None:
        self.steps = 0
        self.depth = 0
        self.classes: dict[str, ast.ClassDef] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        self.globals: dict[str, Any] = {}
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
            elif isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.globals[a.asname] = _Ref(a.name)
                    else:
                        root = a.name.split(".")[0]
                        self.globals[root] = _Ref(root)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.globals[a.asname or a.name] = _Ref(f"{node.module}.{a.name}")
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                try:
                    self.globals[node.targets[0].id] = self.eval(node.value, {}, None)
                except (_Unknown, _Fails):
                    self.globals[node.targets[0].id] = _UNKNOWN

    def tick(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _Unknown("too many evaluation steps")

    # ---- expressions
    def eval(self, node: ast.AST, env: dict[str, Any], mod: _Module | None) -> Any:
        self.tick()
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _Unknown("expression nested too deeply")
            return self._eval(node, env, mod)
        finally:
            self.depth -= 1

    def _eval(self, node: ast.AST, env: dict[str, Any], mod: _Module | None) -> Any:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, int) and not isinstance(node.value, bool) and abs(node.value) > MAX_INT:
                raise _Unknown("integer too large")
            return node.value
        if isinstance(node, ast.Name):
            for scope in (env, self.globals):
                if node.id in scope:
                    v = scope[node.id]
                    if v is _UNKNOWN:
                        raise _Unknown(node.id)
                    return v
            if node.id in _BUILTINS:
                return _Ref(f"builtins.{node.id}")
            if node.id in self.classes:
                return _Ref(f"local.{node.id}")
            if node.id in self.functions:
                return _Ref(f"function.{node.id}")
            raise _Unknown(node.id)
        if isinstance(node, (ast.Tuple, ast.List)):
            items: list[Any] = []
            for e in node.elts:
                if isinstance(e, ast.Starred):
                    items.extend(self._iter(self.eval(e.value, env, mod)))
                else:
                    items.append(self.eval(e, env, mod))
            return tuple(items) if isinstance(node, ast.Tuple) else items
        if isinstance(node, ast.Attribute):
            base = self.eval(node.value, env, mod)
            if isinstance(base, _Ref) and base.path == "math" and node.attr in _MATH_CONSTANTS:
                return _MATH_CONSTANTS[node.attr]
            if isinstance(base, _Ref):
                return _Ref(f"{base.path}.{node.attr}")
            if isinstance(base, _Module):
                if node.attr in base.attrs:
                    return base.attrs[node.attr]
                if node.attr in base.children:
                    child = base.children[node.attr]
                    if child is _UNKNOWN:
                        raise _Unknown(node.attr)
                    return child
            raise _Unknown(f".{node.attr}")
        if isinstance(node, ast.BinOp):
            return self._binop(node.op, self.eval(node.left, env, mod), self.eval(node.right, env, mod))
        if isinstance(node, ast.UnaryOp):
            v = self.eval(node.operand, env, mod)
            if isinstance(node.op, ast.USub) and isinstance(v, (int, float)):
                return -v
            if isinstance(node.op, ast.Not):
                return not self._truth(v)
            if isinstance(node.op, ast.UAdd) and isinstance(v, (int, float)):
                return v
            raise _Unknown("unary operator")
        if isinstance(node, ast.BoolOp):  # Python's: the first operand that decides, short-circuit
            value: Any = None
            for operand in node.values:
                value = self.eval(operand, env, mod)
                if self._truth(value) is isinstance(node.op, ast.Or):
                    return value
            return value
        if isinstance(node, ast.Compare):
            left = self.eval(node.left, env, mod)
            for op, comp in zip(node.ops, node.comparators):
                right = self.eval(comp, env, mod)
                if not self._compare(op, left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.eval(node.body if self._truth(self.eval(node.test, env, mod)) else node.orelse, env, mod)
        if isinstance(node, ast.JoinedStr):
            parts = []
            for v in node.values:
                if isinstance(v, ast.Constant):
                    parts.append(str(v.value))
                elif isinstance(v, ast.FormattedValue) and v.format_spec is None and v.conversion == -1:
                    x = self.eval(v.value, env, mod)
                    if not isinstance(x, (int, str)):
                        raise _Unknown("f-string value")
                    parts.append(str(x))
                else:
                    raise _Unknown("f-string format")
            return "".join(parts)
        if isinstance(node, (ast.ListComp, ast.GeneratorExp)) and len(node.generators) == 1:
            gen = node.generators[0]
            out = []
            for x in self._iter(self.eval(gen.iter, env, mod)):
                local = dict(env)
                self._bind(gen.target, x, local)
                if all(self._truth(self.eval(c, local, mod)) for c in gen.ifs):
                    out.append(self.eval(node.elt, local, mod))
            return out
        if isinstance(node, ast.Dict):
            d = {}
            for k, v in zip(node.keys, node.values):
                if k is None:
                    raise _Unknown("dict unpacking")
                d[self.eval(k, env, mod)] = self.eval(v, env, mod)
            return d
        if isinstance(node, ast.Call):
            return self._call(node, env, mod)
        if isinstance(node, ast.Slice):  # sizes[:-1]
            bounds = [None if b is None else self.eval(b, env, mod) for b in (node.lower, node.upper, node.step)]
            if not all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in bounds) or bounds[2] == 0:
                raise _Unknown("slice")
            return slice(*bounds)
        if isinstance(node, ast.Subscript):
            return self._subscript(self.eval(node.value, env, mod), self.eval(node.slice, env, mod))
        raise _Unknown(type(node).__name__)

    def _subscript(self, base: Any, key: Any) -> Any:
        """``[width, heads][1]``, ``{"k": width}["k"]``, ``cfg["width"]``, ``self.layers[0]``."""
        if isinstance(base, dict) and isinstance(key, (int, str)) and not isinstance(key, bool):
            if key not in base:
                raise _Unknown("missing key")  # a KeyError in the real call, or a key the reader lost
            v = base[key]
        elif isinstance(base, (list, tuple, str)) and isinstance(key, slice):
            v = base[key]
        elif isinstance(base, (list, tuple, str)) and isinstance(key, int) and not isinstance(key, bool):
            if not -len(base) <= key < len(base):
                raise _Unknown("index out of range")
            v = base[key]
        elif isinstance(base, _Module) and base.kind in ("ModuleList", "Sequential") and isinstance(key, int) \
                and not isinstance(key, bool) and -len(base.children) <= key < len(base.children):
            v = list(base.children.values())[key]
        elif isinstance(base, _Module) and base.kind == "ModuleDict" and isinstance(key, str) and key in base.children:
            v = base.children[key]
        else:
            raise _Unknown("subscript")
        if v is _UNKNOWN:
            raise _Unknown("subscript")
        return v

    def _truth(self, v: Any) -> bool:
        if isinstance(v, (int, float, str, tuple, list, dict, type(None))):
            return bool(v)
        raise _Unknown("truth value")

    def _compare(self, op: ast.cmpop, a: Any, b: Any) -> bool:
        if isinstance(op, ast.Is):
            return a is b if a is None or b is None else self._compare(ast.Eq(), a, b)
        if isinstance(op, ast.IsNot):
            return not self._compare(ast.Is(), a, b)
        ok = (int, float, str, type(None))
        if not isinstance(a, ok) or not isinstance(b, ok):
            raise _Unknown("comparison")
        try:
            if isinstance(op, ast.Eq):
                return a == b
            if isinstance(op, ast.NotEq):
                return a != b
            if isinstance(op, ast.Lt):
                return a < b  # type: ignore[operator]
            if isinstance(op, ast.LtE):
                return a <= b  # type: ignore[operator]
            if isinstance(op, ast.Gt):
                return a > b  # type: ignore[operator]
            if isinstance(op, ast.GtE):
                return a >= b  # type: ignore[operator]
        except TypeError:
            pass
        raise _Unknown("comparison")

    def _binop(self, op: ast.operator, a: Any, b: Any) -> Any:
        if isinstance(a, _TensorVal) and isinstance(b, (int, float)) and isinstance(op, (ast.Mult, ast.Add, ast.Sub,
                                                                                       ast.Div)):
            return a
        if isinstance(b, _TensorVal) and isinstance(a, (int, float)) and isinstance(op, (ast.Mult, ast.Add)):
            return b
        nums = (int, float)
        a = int(a) if isinstance(a, bool) else a  # True + 1 == 2, as Python's bools are ints
        b = int(b) if isinstance(b, bool) else b
        if not isinstance(a, nums) or not isinstance(b, nums):
            if isinstance(op, ast.Add) and isinstance(a, str) and isinstance(b, str) and len(a) + len(b) < 1000:
                return a + b
            if isinstance(op, ast.Add) and isinstance(a, (tuple, list)) and type(a) is type(b) and len(a) + len(b) < MAX_ITEMS:
                return a + b  # type: ignore[operator]  # two tuples or two lists: the same type, checked above
            raise _Unknown("operands")
        try:
            if isinstance(op, ast.Add):
                r = a + b
            elif isinstance(op, ast.Sub):
                r = a - b
            elif isinstance(op, ast.Mult):
                r = a * b
            elif isinstance(op, ast.FloorDiv):
                r = a // b
            elif isinstance(op, ast.Mod):
                r = a % b
            elif isinstance(op, ast.Div):
                r = a / b
            elif isinstance(op, ast.Pow) and isinstance(b, int) and 0 <= b <= 64 and abs(a) <= 2**16:
                r = a ** b
            elif isinstance(op, ast.Pow) and isinstance(b, float) and a >= 0 and abs(a) <= 2**16 and -64 <= b <= 64:
                r = a ** b  # a float exponent gives a float, as Python does (4 ** 0.5 == 2.0)
            else:
                raise _Unknown("operator")
        except (ZeroDivisionError, OverflowError):
            raise _Unknown("arithmetic") from None
        if isinstance(r, int) and abs(r) > MAX_INT:
            raise _Unknown("integer too large")
        return r

    def _iter(self, v: Any) -> list[Any]:
        if isinstance(v, (list, tuple)):
            return list(v)
        if isinstance(v, range):
            return list(v)
        raise _Unknown("not iterable")

    def _bind(self, target: ast.AST, value: Any, env: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (tuple, list)) and len(value) == len(target.elts):
            for t, v in zip(target.elts, value):
                self._bind(t, v, env)
        else:
            raise _Unknown("assignment target")

    def _args(self, node: ast.Call, env: dict[str, Any], mod: _Module | None) -> tuple[list[Any], dict[str, Any]]:
        args: list[Any] = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                args.extend(self._iter(self.eval(a.value, env, mod)))
            else:
                args.append(self.eval(a, env, mod))
        kwargs: dict[str, Any] = {}
        for k in node.keywords:
            if k.arg is None:
                v = self.eval(k.value, env, mod)
                if not isinstance(v, dict):
                    raise _Unknown("** argument")
                kwargs.update(v)
            else:
                kwargs[k.arg] = self.eval(k.value, env, mod)
        return args, kwargs

    def _call(self, node: ast.Call, env: dict[str, Any], mod: _Module | None) -> Any:
        func = node.func
        # method calls on values: list.append, ModuleList.append / extend
        if isinstance(func, ast.Attribute) and func.attr in ("append", "extend", "add_module", "register_parameter",
                                                              "register_buffer", "register_module"):
            target = self.eval(func.value, env, mod)
            args, kwargs = self._args(node, env, mod)
            return self._method(target, func.attr, args, kwargs)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) and func.attr == "__init__":
            inner = func.value.func
            if isinstance(inner, ast.Name) and inner.id == "super" and mod is not None:
                args, kwargs = self._args(node, env, mod)
                return self._super_init(env.get("__class__"), mod, args, kwargs)
        if isinstance(func, ast.Attribute) and func.attr in _IN_PLACE:
            # an in-place op (initialization, requires_grad_): names and shapes stay, and torch returns the
            # receiver (``nn.Linear(w, w).requires_grad_(False)`` is the module)
            try:
                return self.eval(func.value, env, mod)
            except _Unknown:
                return _UNKNOWN
        if isinstance(func, ast.Attribute) and func.attr == "apply" and isinstance(func.value, ast.Name) \
                and func.value.id == "self" and mod is not None and len(node.args) == 1 and not node.keywords:
            fn = self._function_of(node.args[0], mod)
            if fn is not None and _values_only(fn):
                return None  # self.apply(init): runs on every submodule, changing values, never names or shapes
            raise _Unknown(".apply() of a function that may change the module tree")
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and mod is not None and self._method_def(mod.kind, func.attr) is not None:
            args, kwargs = self._args(node, env, mod)
            return self._run_method(func.attr, mod, args, kwargs)
        if isinstance(func, ast.Attribute) and func.attr in _VALUE_METHODS:  # after self's own methods
            target = self.eval(func.value, env, mod)
            if isinstance(target, (str, dict)):
                args, kwargs = self._args(node, env, mod)
                return self._value_method(target, func.attr, args, kwargs)
            if func.attr != "insert":
                raise _Unknown(f".{func.attr}()")
            args, kwargs = self._args(node, env, mod)
            return self._method(target, func.attr, args, kwargs)
        callee = self.eval(func, env, mod)
        if isinstance(callee, _Ref) and callee.path.startswith("torch.nn.init."):
            return None  # torch's initializers fill tensors in place: names and shapes stay
        args, kwargs = self._args(node, env, mod)
        if isinstance(callee, _Ref):
            return self._call_ref(callee.path, args, kwargs, mod)
        raise _Unknown("call")

    def _function_of(self, node: ast.AST, mod: _Module) -> ast.FunctionDef | None:
        """The file's own function a reference names: ``self.method`` or a module-level ``function``."""
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            found = self._method_def(mod.kind, node.attr)
            return found[1] if found is not None else None
        if isinstance(node, ast.Name):
            return self.functions.get(node.id)
        return None

    def _value_method(self, target: Any, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The few methods of str and dict a head's ``__init__`` uses for names and config."""
        if isinstance(target, dict) and name == "get" and not kwargs and 1 <= len(args) <= 2:
            return target.get(args[0], args[1] if len(args) > 1 else None)
        if isinstance(target, str):
            if name in ("upper", "lower") and not args and not kwargs:
                return getattr(target, name)()
            if name == "join" and len(args) == 1 and not kwargs:
                items = self._iter(args[0])
                if all(isinstance(i, str) for i in items):
                    return target.join(items)
            if name == "format" and all(isinstance(v, (int, str)) and not isinstance(v, bool)
                                        for v in [*args, *kwargs.values()]):
                try:
                    out = target.format(*args, **kwargs)
                except (IndexError, KeyError, ValueError):
                    raise _Unknown("str.format()") from None
                if len(out) < 1000:
                    return out
        raise _Unknown(f".{name}()")

    def _method_def(self, cls_name: Any, name: str) -> tuple[str, ast.FunctionDef] | None:
        """(defining class, method) of ``self.name`` on an instance of the file's class ``cls_name``, found
        as Python finds it (the class, then its bases in the file); never ``__init__``."""
        seen = 0
        while isinstance(cls_name, str) and cls_name in self.classes and seen < MAX_DEPTH:
            seen += 1
            cls = self.classes[cls_name]
            for node in cls.body:
                if isinstance(node, ast.FunctionDef) and node.name == name and name != "__init__":
                    return cls_name, node
            bases = self._bases(cls)
            cls_name = bases[0][len("local."):] if len(bases) == 1 and bases[0].startswith("local.") else None
        return None

    def _run_method(self, name: str, mod: _Module, args: list[Any], kwargs: dict[str, Any]) -> Any:
        found = self._method_def(mod.kind, name)
        assert found is not None
        cls_name, fn = found
        if fn.decorator_list:
            raise _Unknown(f"decorated method {name}")
        env = self.bind_call(fn, args, kwargs)
        env["__class__"] = cls_name
        self.depth += 1
        try:
            self._run(fn.body, env, mod)
        except _Return as ret:
            return ret.value
        finally:
            self.depth -= 1
        return None

    def _run_function(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """A module-level function of the file (``make_mlp(width)``), followed as a method is, within the same
        bounds. A module it is given is changed through its own name (``m.append(...)``), never ``self``."""
        fn = self.functions[name]
        if fn.decorator_list:
            raise _Unknown(f"decorated function {name}")
        if self.depth > MAX_DEPTH:
            raise _Unknown("calls nested too deeply")
        env = self.bind_call(fn, args, kwargs, method=False)
        if any(isinstance(sub, ast.Name) and sub.id in ("self", "super", "__class__") for sub in _walk(fn)):
            raise _Unknown(f"function {name} names self")  # the reader ties self to the module being built
        self.depth += 1
        try:
            self._run(fn.body, env, _Module(f"<{name}>"))  # nothing names self: this module stays empty
        except _Return as ret:
            return ret.value
        finally:
            self.depth -= 1
        return None

    def _method(self, target: Any, name: str, args: list[Any], kwargs: dict[str, Any]) -> None:
        if name == "insert":
            if kwargs or len(args) != 2 or not isinstance(args[0], int) or isinstance(args[0], bool):
                raise _Unknown(".insert()")
            if isinstance(target, list) and len(target) < MAX_ITEMS:
                target.insert(args[0], args[1])
                return None
            if isinstance(target, _Module) and target.kind == "ModuleList" and len(target.children) < MAX_ITEMS \
                    and 0 <= args[0] <= len(target.children):  # torch shifts keys up from the index (no clamping)
                items = list(target.children.values())
                items.insert(args[0], self._as_child(args[1]))  # torch renumbers the list the same way
                target.children = {str(i): v for i, v in enumerate(items)}
                return None
            raise _Unknown(".insert()")
        if isinstance(target, list) and name in ("append", "extend"):
            items = [args[0]] if name == "append" else self._iter(args[0])
            if len(target) + len(items) > MAX_ITEMS:
                raise _Unknown("list too long")
            target.extend(items)
            return None
        if isinstance(target, _Module):
            if target.kind in ("ModuleList", "Sequential") and name in ("append", "extend"):
                items = [args[0]] if name == "append" else self._iter(args[0])
                for it in items:
                    target.children[str(len(target.children))] = self._as_child(it)
                return None
            if name in ("add_module", "register_module", "register_parameter", "register_buffer") and args:
                key = args[0]
                if isinstance(key, (int, float, bytes, tuple, list, dict)) or key is None:
                    _module_name(key, f".{name}()")  # torch's TypeError: a name is a string
                if not isinstance(key, str):
                    raise _Unknown("module name")
                _module_name(key, f".{name}()", target, tensor=name in ("register_parameter", "register_buffer"))
                given = args[1] if len(args) > 1 else kwargs.get("module", kwargs.get("param"))
                if name in ("add_module", "register_module") and given is not None:
                    self._module_item(given, f".{name}()")
                if name == "register_parameter" and isinstance(given, _TensorVal):
                    raise _Fails(f".register_parameter({key!r}): a tensor is not a Parameter (torch raises TypeError)")
                value = args[1] if len(args) > 1 else kwargs.get("module", kwargs.get("param", kwargs.get("tensor")))
                persistent = kwargs.get("persistent", args[2] if len(args) > 2 else True)
                if name == "register_buffer":
                    if not persistent or value is None:
                        target.children.pop(key, None)
                        return None
                    value = _Param(value.shape, buffer=True) if isinstance(value, _TensorVal) else _UNKNOWN
                target.children[key] = self._as_child(value)
                return None
        raise _Unknown(f".{name}()")

    def _module_item(self, v: Any, container: str) -> Any:
        """An item a ModuleList / Sequential / ModuleDict registers: a plain value is torch's TypeError."""
        if isinstance(v, (int, float, str, bytes, tuple, list, dict, _Param, _TensorVal)):
            raise _Fails(f"{container}: {type(v).__name__.strip('_')} is not a Module subclass")
        return self._as_child(v)

    def _as_child(self, v: Any) -> Any:
        if isinstance(v, (_Module, _Param)) or v is _UNKNOWN:
            return v
        raise _Unknown("not a module")

    def _call_ref(self, path: str, args: list[Any], kwargs: dict[str, Any], mod: _Module | None) -> Any:
        if path == "builtins.range":
            if kwargs or not 1 <= len(args) <= 3 or not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
                raise _Unknown("range()")
            r = range(*args)
            if len(r) > MAX_ITEMS:
                raise _Unknown("range too long")
            return r
        if path in ("builtins.len", "builtins.int", "builtins.max", "builtins.min", "builtins.tuple", "builtins.list"):
            fn = path.split(".")[1]
            if kwargs:
                raise _Unknown(fn)
            if fn == "len" and len(args) == 1:
                return len(self._iter(args[0]) if not isinstance(args[0], str) else args[0])
            if fn == "int" and len(args) == 1 and (isinstance(args[0], (int, float))
                                                   or isinstance(args[0], str) and len(args[0]) <= 64):
                try:  # Python's own: int(64.0), int(" 4 "); int("4.0"), int(nan) raise in the head too
                    return int(args[0])
                except (ValueError, OverflowError) as exc:
                    raise _Fails(f"int({args[0]!r}) raises {type(exc).__name__}") from None
            if fn in ("tuple", "list") and len(args) == 1:
                items = self._iter(args[0])
                return tuple(items) if fn == "tuple" else items
            if fn in ("max", "min") and args:
                vals = self._iter(args[0]) if len(args) == 1 else args
                if vals and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
                    return max(vals) if fn == "max" else min(vals)
            raise _Unknown(fn)
        if path == "builtins.enumerate" and not kwargs and len(args) == 1:
            return list(enumerate(self._iter(args[0])))
        if path == "builtins.zip" and not kwargs and args:
            return list(zip(*(self._iter(a) for a in args)))
        if path in ("builtins.round", "builtins.abs") and not kwargs and len(args) == 1 \
                and isinstance(args[0], (int, float)) and abs(args[0]) < 1e15:
            return round(args[0]) if path == "builtins.round" else abs(args[0])
        if path == "builtins.round" and not kwargs and len(args) == 2 and isinstance(args[0], (int, float)) \
                and abs(args[0]) < 1e15 and isinstance(args[1], int) and not isinstance(args[1], bool) \
                and abs(args[1]) <= 20:
            return round(args[0], args[1])  # with ndigits a float stays a float (round(16.0, 0) == 16.0)
        if path in ("builtins.dict", "builtins.OrderedDict", "collections.OrderedDict"):
            if len(args) > 1:
                raise _Unknown("dict()")
            d: dict[Any, Any] = {}
            if args:
                src = args[0]
                pairs = list(src.items()) if isinstance(src, dict) else self._iter(src)
                for pair in pairs:
                    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], (str, int)):
                        raise _Unknown("dict()")
                    d[pair[0]] = pair[1]
            d.update(kwargs)
            return d
        if path == "builtins.delattr" and len(args) == 2 and isinstance(args[0], _Module) and isinstance(args[1], str):
            self._delete(args[0], args[1])
            return None
        if path == "builtins.setattr" and len(args) == 3 and isinstance(args[0], _Module) and isinstance(args[1], str):
            if "." in args[1] and isinstance(args[2], (_Module, _Param)):
                raise _Fails(f"setattr(self, {args[1]!r}, ...): torch builds it, but load_state_dict cannot load "
                             "a dotted child name (its tensors are unexpected, or missing without them)")
            self._set(args[0], args[1], args[2])
            return None
        if path.startswith("math.") and path[5:] in _MATH_FUNCTIONS and not kwargs and len(args) == 1 \
                and isinstance(args[0], (int, float)) and not isinstance(args[0], bool) and abs(args[0]) < 1e12:
            try:
                return _MATH_FUNCTIONS[path[5:]](args[0])
            except (ValueError, OverflowError):
                raise _Unknown(path) from None
        if path.endswith(".__init__") and _torch_name(path[: -len(".__init__")]) == "Module":
            return None  # nn.Module.__init__(self)
        if path.startswith("local."):
            return self._instantiate(path[len("local."):], args, kwargs)
        if path.startswith("function."):
            return self._run_function(path[len("function."):], args, kwargs)
        if path.startswith("torch.") and path.split(".")[1] in _TENSOR_MAKERS:
            return self._tensor(path.split(".")[1], args, kwargs)
        if path == "torch.tensor" and args:
            shape = self._shape_of_data(args[0])
            return _TensorVal(shape, self._floating(kwargs, self._data_floating(args[0])))
        name = _torch_name(path)
        if name is None:
            raise _Unknown(path)
        return self._torch_module(name, args, kwargs)

    @staticmethod
    def _floating(kwargs: dict[str, Any], default: bool | None) -> bool | None:
        """From a ``dtype=`` given as ``torch.<name>``; ``default`` (the maker's own) when none is given."""
        dtype = kwargs.get("dtype")
        if dtype is None:
            return default
        if isinstance(dtype, (str, int, float)):
            raise _Fails(f"dtype={dtype!r}: torch takes a torch.dtype (TypeError)")
        name = dtype.path.removeprefix("torch.") if isinstance(dtype, _Ref) else ""
        return True if name in _FLOAT_DTYPES else False if name in _INTEGER_DTYPES else None

    @staticmethod
    def _data_floating(v: Any) -> bool | None:
        """``torch.tensor(data)``'s dtype: float32 when any item is a float, int64 / bool otherwise."""
        flat: list[Any] = []
        todo = [v]
        while todo:
            x = todo.pop()
            if isinstance(x, (list, tuple)):
                todo.extend(x)
            else:
                flat.append(x)
        if not flat or any(isinstance(x, float) for x in flat):
            return True  # torch.tensor([]) is float32 too
        return False if all(isinstance(x, int) for x in flat) else None

    def _shape_of_data(self, v: Any) -> tuple[int, ...]:
        if isinstance(v, (int, float)):  # bool included: torch.tensor(True) is a bool scalar
            return ()
        if isinstance(v, (list, tuple)):
            if not v:
                return (0,)
            inner = {self._shape_of_data(x) for x in v}
            if len(inner) == 1:
                return (len(v), *inner.pop())
        raise _Unknown("tensor data")

    def _tensor(self, fn: str, args: list[Any], kwargs: dict[str, Any]) -> _TensorVal:
        if fn == "arange":
            if not 1 <= len(args) <= 3 or not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
                raise _Unknown("arange()")
            return _TensorVal((len(range(*args)),), self._floating(kwargs, False))  # int64 from int bounds
        floating: bool | None = True  # torch's default dtype, float32
        if fn == "full":
            fill = args[1] if len(args) > 1 else kwargs.get("fill_value")
            floating = True if isinstance(fill, float) else False if isinstance(fill, int) else None  # as torch infers
            args = args[:1]
        if "size" in kwargs:
            args = [kwargs["size"]]
        if len(args) == 1 and isinstance(args[0], (tuple, list)):
            args = list(args[0])
        return _TensorVal(tuple(_dim(a) for a in args), self._floating(kwargs, floating))

    def _torch_module(self, name: str, args: list[Any], kwargs: dict[str, Any]) -> _Module:
        m = _Module(name)
        if name == "Parameter":
            value = args[0] if args else kwargs.get("data")
            if not isinstance(value, _TensorVal):
                raise _Unknown("Parameter data")
            grad = args[1] if len(args) > 1 else kwargs.get("requires_grad", True)
            if grad is None or isinstance(grad, (int, float, str, tuple, list, dict)) and not isinstance(grad, bool):
                raise _Fails(f"nn.Parameter(requires_grad={grad!r}): torch takes a bool (TypeError)")
            if value.floating is False and grad is True:
                raise _Fails("nn.Parameter of an integer or bool tensor: only floating point tensors can require "
                             "gradients (torch raises RuntimeError)")
            return _Param(value.shape)  # type: ignore[return-value]
        if name in ("Dropout", "Dropout1d", "Dropout2d"):
            _probability(args[0] if args else kwargs.get("p", 0.5), name)
        if name in _NO_PARAMS:
            return m
        if name in TORCH_PARAMS and self._floating(kwargs, True) is False:  # its Parameters require grad
            raise _Fails(f"nn.{name}(dtype={kwargs['dtype'].path}): only floating point parameters can require "
                         "gradients (torch raises RuntimeError)")
        if name in ("ModuleList", "Sequential", "ModuleDict"):
            items = args[0] if name != "Sequential" and args else (args if name == "Sequential" else [])
            if name != "Sequential" and not args:
                items = kwargs.get("modules", items)  # ModuleList(modules=[...]), ModuleDict(modules={...})
            if items is None:
                items = []  # ModuleList(None), ModuleDict(None): empty, as torch's default
            if name == "ModuleDict":
                items = {} if items == [] else items  # ModuleDict() / ModuleDict(None): empty
                if not isinstance(items, dict):
                    raise _Unknown("ModuleDict")
                for k, v in items.items():
                    m.children[_module_name(k, name, m)] = self._module_item(v, name)
                return m
            if name == "Sequential" and len(args) == 1 and isinstance(args[0], dict):
                for k, v in args[0].items():  # Sequential(OrderedDict(...)): named children
                    m.children[_module_name(k, name, m)] = self._module_item(v, name)
                return m
            for i, it in enumerate(self._iter(items)):
                m.children[str(i)] = self._module_item(it, name)
            return m
        if name not in TORCH_PARAMS:
            raise _Unknown(f"torch.nn.{name}")
        sig, build = TORCH_PARAMS[name]
        renames = _KEYWORDS.get(name, {})
        if any(k in kwargs for k in renames.values()):
            raise _Fails(f"{name}() got an unexpected keyword argument")
        kwargs = {renames.get(k, k): v for k, v in kwargs.items()}
        if name in ("GRU", "RNN") and "proj_size" in kwargs:
            raise _Fails("proj_size argument is only supported for LSTM, not RNN or GRU")
        bound = self._bind_sig(name, sig, _REQUIRED[name], args, kwargs)
        m.children = build(bound)
        self.steps += _size(m)  # what a layer builds (deep copies, many RNN layers) counts as evaluation steps
        if self.steps > MAX_STEPS:
            raise _Unknown("too many evaluation steps")
        return m

    def _bind_sig(self, name: str, sig: tuple[tuple[str, Any], ...], required: int, args: list[Any],
                  kwargs: dict[str, Any]) -> dict[str, Any]:
        if len(args) > len(sig):
            raise _Fails(f"{name}() takes at most {len(sig)} arguments")
        bound = {k: d for k, d in sig}
        given = set()
        for (k, _), v in zip(sig, args):
            bound[k] = v
            given.add(k)
        for k, v in kwargs.items():
            if k not in bound:
                raise _Fails(f"{name}() got an unexpected keyword argument {k!r}")
            bound[k] = v
            given.add(k)
        missing = [k for k, _ in sig[:required] if k not in given]
        if missing:
            raise _Fails(f"{name}() is missing {missing}")
        return bound

    # ---- classes and statements
    def _bases(self, cls: ast.ClassDef) -> list[str]:
        out = []
        for b in cls.bases:
            try:
                v = self.eval(b, {}, None)
            except _Unknown:
                out.append("?")
                continue
            out.append(v.path if isinstance(v, _Ref) else "?")
        return out

    def _init_of(self, cls: ast.ClassDef) -> ast.FunctionDef | None:
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                return node
        return None

    def _instantiate(self, cls_name: str, args: list[Any], kwargs: dict[str, Any]) -> _Module:
        if self.depth > MAX_DEPTH:
            raise _Unknown("classes nested too deeply")
        cls = self.classes[cls_name]
        mod = _Module(cls_name)
        self._run_init(cls, mod, args, kwargs)
        return mod

    def _run_init(self, cls: ast.ClassDef, mod: _Module, args: list[Any], kwargs: dict[str, Any]) -> None:
        init = self._init_of(cls)
        if init is None:
            self._super_init(cls.name, mod, args, kwargs)
            return
        env = self.bind_call(init, args, kwargs)
        env["__class__"] = cls.name
        self.depth += 1
        try:
            self._run(init.body, env, mod)
        except _Return:
            pass  # an early ``return`` in __init__
        finally:
            self.depth -= 1

    def _super_init(self, cls_name: Any, mod: _Module, args: list[Any], kwargs: dict[str, Any]) -> None:
        if not isinstance(cls_name, str) or cls_name not in self.classes:
            raise _Unknown("super()")
        bases = self._bases(self.classes[cls_name])
        if len(bases) != 1:
            raise _Unknown("bases")
        base = bases[0]
        if base.startswith("local."):
            self._run_init(self.classes[base[len("local."):]], mod, args, kwargs)
            return
        name = _torch_name(base)
        if name == "Module":
            return
        if name is not None and (name in TORCH_PARAMS or name in _NO_PARAMS):
            mod.children.update(self._torch_module(name, args, kwargs).children)
            return
        raise _Unknown(f"base {base}")

    def bind_call(self, fn: ast.FunctionDef, args: list[Any], kwargs: dict[str, Any],
                  method: bool = True) -> dict[str, Any]:
        """Bind arguments as Python would; ``_Fails`` (a TypeError in the real call) when it cannot."""
        a = fn.args
        everything = [p.arg for p in a.posonlyargs + a.args]
        params = everything[1 if method else 0:]  # a method's without self
        posonly = {p.arg for p in a.posonlyargs} - ({everything[0]} if method and everything else set())
        if method and everything and everything[0] in kwargs and everything[0] not in posonly \
                and len(a.posonlyargs) == 0:
            raise _Fails(f"{fn.name}() got multiple values for argument {everything[0]!r}")
        defaults = a.defaults
        env: dict[str, Any] = {}
        if len(args) > len(params) and a.vararg is None:
            raise _Fails(f"{fn.name}() takes {len(params)} positional arguments, {len(args)} given")
        for p, v in zip(params, args):
            env[p] = v
        if a.vararg is not None:
            env[a.vararg.arg] = tuple(args[len(params):])
        extra: dict[str, Any] = {}
        kwonly = [k.arg for k in a.kwonlyargs]
        for k, v in kwargs.items():
            if k in env:
                raise _Fails(f"{fn.name}() got multiple values for argument {k!r}")
            if (k in params and k not in posonly) or k in kwonly:
                env[k] = v
            elif a.kwarg is not None:
                extra[k] = v
            elif k in posonly:
                raise _Fails(f"{fn.name}() got some positional-only arguments passed as keyword arguments: {k!r}")
            else:
                raise _Fails(f"{HEAD_CLASS if fn.name == '__init__' else fn.name}() got an unexpected keyword "
                             f"argument {k!r}")
        first_default = len(params) - len(defaults)
        for i, p in enumerate(params):
            if p not in env:
                if i >= first_default:
                    env[p] = self._default(defaults[i - first_default])
                else:
                    raise _Fails(f"missing a required argument: {p!r}")
        for kw, d in zip(a.kwonlyargs, a.kw_defaults):
            if kw.arg not in env:
                if d is None:
                    raise _Fails(f"missing a required keyword-only argument: {kw.arg!r}")
                env[kw.arg] = self._default(d)
        if a.kwarg is not None:
            env[a.kwarg.arg] = extra
        if method:
            env["self"] = None  # replaced by the caller's module through _run
        return env

    def _default(self, node: ast.AST) -> Any:
        try:
            return self.eval(node, {}, None)
        except _Unknown:
            return _UNKNOWN

    def _set(self, mod: _Module, name: str, value: Any) -> None:
        """``self.name = value`` as ``nn.Module.__setattr__`` does: a plain tensor replaces a buffer of that
        name, and is a TypeError on a parameter's name; a plain value on a child module's name is one too."""
        held = mod.children.get(name)
        if isinstance(value, _TensorVal) and isinstance(held, _Param):
            if not held.buffer:
                raise _Fails(f"self.{name} = a tensor: cannot assign it as parameter {name!r} (torch raises TypeError)")
            mod.children[name] = _Param(value.shape, buffer=True)
            return
        if isinstance(held, _Param) and value is not None and value is not _UNKNOWN \
                and not isinstance(value, (_Module, _Param)):
            raise _Fails(f"self.{name} = {type(value).__name__.strip('_')}: cannot assign it as "
                         f"{'buffer' if held.buffer else 'parameter'} {name!r} (torch raises TypeError)")
        if isinstance(held, _Module) and value is not None and not isinstance(value, (_Module, _Param)) \
                and value is not _UNKNOWN:
            raise _Fails(f"self.{name} = {type(value).__name__.strip('_')}: cannot assign it as child module "
                         f"{name!r} (torch raises TypeError)")
        if isinstance(value, (_Module, _Param)) or value is _UNKNOWN:
            mod.attrs.pop(name, None)
            mod.children[name] = value
        elif value is None and name in mod.children:
            mod.children[name] = None
        else:
            mod.attrs[name] = value

    def _delete(self, mod: _Module, name: str) -> None:
        """``del self.name`` / ``delattr(self, name)``: the module, parameter or value is gone with its subtree."""
        if name in mod.children:
            del mod.children[name]
        elif name in mod.attrs:
            del mod.attrs[name]
        else:
            raise _Unknown(f"del of {name}")  # an AttributeError in the real call, or something the reader lost

    def _assign(self, target: ast.AST, value: Any, env: dict[str, Any], mod: _Module) -> None:
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            self._set(mod, target.attr, value)
        elif isinstance(target, ast.Subscript):
            base = self.eval(target.value, env, mod)
            key = self.eval(target.slice, env, mod)
            if isinstance(base, _Module) and base.kind in ("ModuleList", "Sequential") and isinstance(key, int) \
                    and not isinstance(key, bool) and -len(base.children) <= key < len(base.children):
                names = list(base.children)
                base.children[names[key]] = self._as_child(value)  # ModuleList.__setitem__
            elif isinstance(base, _Module) and base.kind == "ModuleDict" and isinstance(key, str):
                base.children[_module_name(key, "ModuleDict[key] =", base)] = self._module_item(value, "ModuleDict")
            elif isinstance(base, dict) and isinstance(key, (str, int)) and not isinstance(key, bool):
                base[key] = value
            elif isinstance(base, list) and isinstance(key, int) and not isinstance(key, bool) \
                    and -len(base) <= key < len(base):
                base[key] = value
            else:
                raise _Unknown("subscript assignment")
        elif isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            if not isinstance(value, (tuple, list)) or len(value) != len(target.elts):
                raise _Unknown("unpacking")
            for t, v in zip(target.elts, value):
                self._assign(t, v, env, mod)
        else:
            raise _Unknown("assignment target")

    def _self_targets(self, body: list[ast.stmt]) -> set[str]:
        names = set()
        for node in body:
            for sub in _walk(node):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self" \
                        and isinstance(sub.ctx, ast.Store):
                    names.add(sub.attr)
        return names

    def _inert_here(self, body: list[ast.stmt], env: dict[str, Any]) -> bool:
        """Whether statements the reader cannot evaluate can be skipped because torch's result does not
        depend on them: ``_inert`` (no ``self``, no binding, no leaving the block), and every name they
        read holds a plain value (``_plain``): not a module, a list or a dict a call could change, and not
        the file's own function or class (it could change the file's globals)."""
        if not _inert(body):
            return False
        for node in body:
            for sub in _walk(node):
                if not isinstance(sub, ast.Name):
                    continue
                if sub.id in self.functions or (sub.id in self.classes and sub.id not in env):
                    return False
                scope = env if sub.id in env else self.globals if sub.id in self.globals else None
                if scope is not None and not _plain(scope[sub.id]):
                    return False
        return True

    def _only_self_assignments(self, body: list[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, ast.If):
                if not self._only_self_assignments(node.body + node.orelse):
                    return False
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if not all(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                           for t in targets):
                    return False
            elif not isinstance(node, ast.Pass):
                return False
        return True

    def _run(self, body: list[ast.stmt], env: dict[str, Any], mod: _Module) -> None:
        env["self"] = mod
        for node in body:
            try:
                self._statement(node, env, mod)
            except _Unknown as exc:
                if exc.line is None:
                    exc.line = node.lineno  # the innermost statement: the one to name
                raise

    def _statement(self, node: ast.stmt, env: dict[str, Any], mod: _Module) -> None:
        self.tick()
        if isinstance(node, ast.Break):
            raise _Break()
        if isinstance(node, ast.Continue):
            raise _Continue()
        if isinstance(node, ast.Delete):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    self._delete(mod, t.attr)
                elif isinstance(t, ast.Name) and t.id in env:
                    del env[t.id]
                else:
                    raise _Unknown("del")
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                env[a.asname or a.name.split(".")[0]] = _Ref(a.name if a.asname else a.name.split(".")[0])
            return
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if a.name == "*":
                    raise _Unknown("import *")
                env[a.asname or a.name] = _Ref(f"{node.module}.{a.name}")
            return
        if isinstance(node, ast.Pass):
            return
        if isinstance(node, ast.Assert):  # decided: a failing one is the head's AssertionError; else not judged
            try:
                holds = self._truth(self.eval(node.test, env, mod))
            except _Unknown:
                return
            if not holds:
                raise _Fails(f"line {node.lineno}: an assert fails at this config (AssertionError)")
            return
        if isinstance(node, ast.Raise):  # reached: every branch to it was decided
            raise _Fails(f"line {node.lineno}: the head raises at this config")
        if isinstance(node, ast.Return):
            raise _Return(None if node.value is None else self.eval(node.value, env, mod))
        if isinstance(node, ast.Expr):
            if isinstance(node.value, ast.Constant):
                return
            try:
                if not isinstance(node.value, ast.Call):
                    raise _Unknown("expression statement")
                self.eval(node.value, env, mod)
            except _Unknown:
                if self._inert_here([node], env):
                    return  # print(...), logger.info(...), warnings.warn(...): torch's tree does not depend on it
                raise
            return
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            if node.value is None:
                return
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            why = ""
            try:
                value = self.eval(node.value, env, mod)
            except _Unknown as exc:
                value = _UNKNOWN
                why = f"line {exc.line or node.lineno}: {exc}"
            for t in targets:
                if value is _UNKNOWN and not (isinstance(t, ast.Attribute) or isinstance(t, ast.Name)):
                    raise _Unknown("unpacking of an unknown value")
                self._assign(t, value, env, mod)
                if why and isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    mod.why[t.attr] = why
            return
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            env[node.target.id] = self._binop(node.op, self.eval(node.target, env, mod),
                                              self.eval(node.value, env, mod))
            return
        if isinstance(node, ast.For) and not node.orelse:
            for x in self._iter(self.eval(node.iter, env, mod)):
                self._bind(node.target, x, env)
                try:
                    self._run(node.body, env, mod)
                except _Continue:
                    continue
                except _Break:
                    break
            return
        if isinstance(node, ast.If):
            try:
                branch = node.body if self._truth(self.eval(node.test, env, mod)) else node.orelse
            except _Unknown as exc:
                if self._inert_here(node.body + node.orelse, env):
                    return  # e.g. a warning logged: neither branch can change the module tree
                if not self._only_self_assignments(node.body + node.orelse):
                    raise _Unknown("an if the reader cannot decide") from None
                for name in self._self_targets(node.body + node.orelse):
                    mod.children[name] = _UNKNOWN  # either branch's module: unknown, never guessed
                    mod.why[name] = f"line {node.lineno}: an if the reader cannot decide ({exc})"
                return
            self._run(branch, env, mod)
            return
        raise _Unknown(type(node).__name__)


#: Calls that change a module's names, shapes or dtypes (a function passed to ``apply`` must make none).
_STRUCTURE_CALLS = {"add_module", "register_module", "register_parameter", "register_buffer", "to", "type", "half",
                    "float", "double", "bfloat16", "apply", "append", "extend", "insert", "setattr", "delattr",
                    "__setattr__", "__delattr__", "set_", "resize_", "as_strided_", "load_state_dict"}


def _values_only(fn: ast.FunctionDef) -> bool:
    """Whether a function (an initializer given to ``Module.apply``) can change only tensor values: it assigns
    no attribute or item and calls nothing that adds, removes, reshapes or recasts a module's tensors."""
    for sub in _walk(fn):
        if isinstance(sub, (ast.Attribute, ast.Subscript)) and not isinstance(sub.ctx, ast.Load):
            return False
        if isinstance(sub, ast.Call):
            f = sub.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name is None or name in _STRUCTURE_CALLS or name in _DYNAMIC:
                return False
        if isinstance(sub, (ast.Global, ast.Nonlocal, ast.Lambda, ast.FunctionDef, ast.ClassDef)) and sub is not fn:
            return False
    return True


def _inert(body: list[ast.stmt]) -> bool:
    """Statements that cannot change the module tree, whichever runs: they name no ``self``, bind no name,
    and neither raise nor leave the block (``logger.warning(...)``, ``warnings.warn(...)``, ``pass``): only
    expression statements, ``pass`` and ``if``s of them, however nested. What the names they do read hold is
    ``_Reader._inert_here``'s part (a call given a module or a list may change the tree)."""
    for node in body:
        for sub in _walk(node):
            if isinstance(sub, ast.stmt) and not isinstance(sub, (ast.Expr, ast.Pass, ast.If)):
                return False  # return, raise, an assignment, a loop (break), a def...
            if isinstance(sub, (ast.Yield, ast.YieldFrom, ast.Await)):
                return False
            if isinstance(sub, ast.Name) and (sub.id in ("self", "super", "setattr", "delattr", "__class__")
                                              or not isinstance(sub.ctx, ast.Load)):
                return False
            if isinstance(sub, (ast.NamedExpr, ast.Lambda, ast.Attribute)) and not isinstance(
                    getattr(sub, "ctx", ast.Load()), ast.Load):
                return False
    return True


def _plain(v: Any, depth: int = 0) -> bool:
    """A value no call can change the module tree through: a number, a string, a name of torch or of another
    module (``logging``), an unknown value (whatever it is, the reader never uses it to build a module), a
    tuple of those. A module, a list or a dict may be changed by the call, and then the tree with it."""
    if v is None or v is _UNKNOWN or isinstance(v, (bool, int, float, str, range, _Ref)):
        return True
    if isinstance(v, tuple) and depth < 8:
        return all(_plain(x, depth + 1) for x in v)
    return False


def _flatten(mod: _Module, prefix: str, tensors: dict[str, tuple[int, ...]], unknown: list[str],
             why: list[str]) -> None:
    for name, child in mod.children.items():
        path = f"{prefix}{name}"
        if child is _UNKNOWN:
            unknown.append(path)
            why.append(mod.why.get(name, "an expression the reader does not evaluate"))
        elif isinstance(child, _Param):
            tensors[path] = child.shape
        elif isinstance(child, _Module):
            _flatten(child, path + ".", tensors, unknown, why)


def parse_source(source: bytes) -> tuple[ast.Module | None, str]:
    """The syntax tree, or None and why: ``invalid: ...`` (not Python) or ``unread: ...`` (over limits)."""
    if len(source) > MAX_SOURCE_BYTES:
        return None, f"unread: {len(source)} bytes, over the {MAX_SOURCE_BYTES} bytes the reader parses"
    try:  # the bytes, decoded by the compiler as an import does (a BOM, a coding cookie, bytes in comments)
        tree = compile(source, "joint_schema_model.py", "exec", ast.PyCF_ONLY_AST)  # what ast.parse does
    except SyntaxError as exc:
        return None, f"invalid: {exc.msg} (line {exc.lineno})"
    except (RecursionError, MemoryError) as exc:
        return None, f"unread: nested too deeply to parse ({type(exc).__name__})"
    except ValueError as exc:  # null bytes
        return None, f"invalid: {exc}"
    assert isinstance(tree, ast.Module)  # mode "exec" with PyCF_ONLY_AST
    return tree, ""


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    """Whether a tensor name lies in one of these module subtrees (``""``: the whole head)."""
    return any(p == "" or name == p or name.startswith(p + ".") for p in prefixes)


#: Names whose use means the file can change what its names resolve to while it runs.
_DYNAMIC = {"globals", "vars", "locals", "exec", "eval", "__import__", "__builtins__", "compile", "importlib",
            "__dict__", "__setattr__", "__delattr__", "__class__", "sys"}


def _children(node: ast.AST) -> list[ast.AST]:
    """The direct child nodes, in field order (``ast.iter_child_nodes``)."""
    out: list[ast.AST] = []
    node_type = ast.AST
    for field in node._fields:
        value = getattr(node, field, None)
        if type(value) is list:
            out += [v for v in value if isinstance(v, node_type)]
        elif isinstance(value, node_type):
            out.append(value)
    return out


def _walk(node: ast.AST) -> list[ast.AST]:
    """Every node under ``node``, itself first, in ``ast.walk``'s breadth-first order."""
    out = [node]
    i = 0
    while i < len(out):
        out.extend(_children(out[i]))
        i += 1
    return out


def _unparse(node: ast.AST) -> str:
    """Source text for a message (only ever on the way to a finding)."""
    import ast as ast_py

    return ast_py.unparse(node)


def _root(node: ast.AST) -> ast.AST:
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node


def _module_bindings(tree: ast.Module) -> dict[str, list[tuple[int, str]]]:
    """Each name bound at module level (outside functions and classes) -> (line, what it binds) of each
    binding; an import binds the module it names (``import torch`` and ``import torch.nn`` bind the same)."""
    out: dict[str, list[tuple[int, str]]] = {}
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.setdefault(node.name, []).append((node.lineno, f"def@{node.lineno}"))
            todo.extend(node.decorator_list)
            continue
        if isinstance(node, ast.Import):
            for a in node.names:
                name = a.asname or a.name.split(".")[0]
                out.setdefault(name, []).append((node.lineno, a.name if a.asname else name))
            continue
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                what = f"{node.module}.{a.name}" if node.module and not node.level else f"from@{node.lineno}"
                out.setdefault(a.asname or a.name, []).append((node.lineno, what))
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            out.setdefault(node.id, []).append((node.lineno, f"assign@{node.lineno}:{node.col_offset}"))
        if isinstance(node, ast.Lambda):
            continue
        todo.extend(_children(node))
    return out


#: The node types ``_dynamic`` looks into beyond names and attributes (the parser makes exact types).
_BINDING_KINDS = frozenset({ast.Global, ast.Nonlocal, ast.Assign, ast.Delete, ast.AugAssign, ast.AnnAssign, ast.For,
                            ast.With, ast.comprehension, ast.Call})


def _dynamic(node: ast.AST) -> str:
    """Why this one node may make the names the reader resolves differ from what Python runs, or ""."""
    if isinstance(node, ast.Name):  # one dispatch per node: tampering asks every node of the file
        return f"line {node.lineno}: {node.id}" if node.id in _DYNAMIC else ""
    if isinstance(node, ast.Attribute):
        return f"line {node.lineno}: .{node.attr}" if node.attr in _DYNAMIC else ""
    if type(node) not in _BINDING_KINDS:
        return ""
    line = getattr(node, "lineno", 0)
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return f"line {line}: {type(node).__name__.lower()} {', '.join(node.names)}"
    targets: list[ast.AST] = []
    if isinstance(node, (ast.Assign, ast.Delete)):
        targets = list(node.targets)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        targets = [node.target]
    elif isinstance(node, (ast.For, ast.With, ast.comprehension)):
        targets = [node.target] if not isinstance(node, ast.With) else [i.optional_vars for i in node.items
                                                                        if i.optional_vars is not None]
    for t in targets:
        for sub in _walk(t):
            if isinstance(sub, (ast.Attribute, ast.Subscript)) and isinstance(sub.ctx, (ast.Store, ast.Del)):
                root = _root(sub)
                if not (isinstance(root, ast.Name) and root.id == "self"):
                    return f"line {line}: assignment to {_unparse(sub)}"
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr", "getattr") \
            and node.args:
        root = _root(node.args[0])
        if not (isinstance(root, ast.Name) and root.id == "self"):
            return f"line {line}: {node.func.id}({_unparse(node.args[0])}, ...)"
    return ""


def tampering(tree: ast.Module) -> str:
    """Why the names the reader resolves (torch's classes, the file's own) may not be what Python runs, or "".

    The reader takes ``nn.LayerNorm`` for torch's: a file that assigns to an attribute of a module
    (``nn.LayerNorm = Mine``, ``setattr(nn, ...)``), rebinds a name it imported or defined
    (``from torch.nn import LayerNorm`` then ``LayerNorm = Mine``), reaches ``globals()`` and the like, or
    runs code at import is not read: trusting it would call a head OK that torch builds otherwise.
    """
    bindings = _module_bindings(tree)
    shadowed = sorted((min(bindings[n])[0], n) for n in _BUILTINS if n in bindings)
    if shadowed:  # the reader resolves these as Python's builtins
        return f"line {shadowed[0][0]}: {shadowed[0][1]} is bound at module level"
    star, dynamic = "", ""
    for node in _walk(tree):  # one pass: the first star import and the first dynamic reach, in walk order
        if not star and isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            star = f"line {node.lineno}: from {node.module} import *"
        if not dynamic:
            dynamic = _dynamic(node)
        if star:
            break
    if star:
        return star
    rebound = sorted((sorted(b)[1][0], name) for name, b in bindings.items() if len({w for _, w in b}) > 1)
    if rebound:
        return f"line {rebound[0][0]}: {rebound[0][1]} is bound again at module level"
    if dynamic:
        return dynamic
    for node in tree.body:
        if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant):
            return f"line {node.lineno}: code run at import ({_unparse(node)[:60]})"
        if isinstance(node, ast.ClassDef):
            for item in node.body:  # a class's own add_module / register_buffer / state_dict... is not torch's
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in _TORCH_OVERRIDES:
                    return f"line {item.lineno}: {node.name} defines its own {item.name}"
    return ""


#: nn.Module methods the reader takes as torch's (registration and what the state_dict holds): a class
#: defining its own is followed by nothing the reader knows.
_TORCH_OVERRIDES = frozenset({"add_module", "register_module", "register_parameter", "register_buffer",
                              "state_dict", "_save_to_state_dict", "named_parameters", "named_buffers",
                              "get_extra_state", "__setattr__", "__getattr__", "__delattr__"})


def read_reference(source: bytes, config: Mapping[str, Any]) -> Reference:
    """The head ``JointSchemaHead(**config)`` builds, read from the reference file's bytes without running it."""
    tree, why = parse_source(source)
    if tree is None:
        status, _, reason = why.partition(": ")
        return Reference(status, reason)
    try:
        why = tampering(tree)
        if why:
            return Reference("unread", f"{why}: the names it uses may not be torch's or its own")
        reader = _Reader(tree)
        cls = reader.classes.get(HEAD_CLASS)
        if cls is None:
            return Reference("unread", f"no class {HEAD_CLASS} at the top level")
        init = reader._init_of(cls)
        config = dict(config)
        rejected: tuple[str, ...] = ()
        if init is not None:
            if init.args.kwarg is None:
                named = (init.args.posonlyargs + init.args.args)[1:]  # self: the instance, not a key
                takes = {p.arg for p in named + init.args.kwonlyargs} - {p.arg for p in init.args.posonlyargs}
                rejected = tuple(sorted(k for k in config if k not in takes))
                config = {k: v for k, v in config.items() if k in takes}
            try:
                reader.bind_call(init, [], config)
            except _Fails as exc:
                return Reference("ok", "", {}, ("",), f"{HEAD_CLASS}(**config) raises TypeError: {exc}", "missing",
                                 rejected)
        mod = _Module(HEAD_CLASS)
        stopped = ""
        try:
            reader._run_init(cls, mod, [], config)
        except _Fails as exc:
            return Reference("ok", "", {}, ("",), f"{HEAD_CLASS}(**config) raises: {exc}", "fails", rejected)
        except _Unknown as exc:
            stopped = (f"line {exc.line}: " if exc.line else "") + (str(exc) or "an expression the reader does not "
                                                                    "evaluate")
        tensors: dict[str, tuple[int, ...]] = {}
        unknown: list[str] = []
        whys: list[str] = []
        _flatten(mod, "", tensors, unknown, whys)
        if stopped:
            return Reference("ok", f"read up to {stopped}", tensors, ("", *unknown), rejected=rejected,
                             why=(stopped, *whys))
        return Reference("ok", "", tensors, tuple(unknown), rejected=rejected, why=tuple(whys))
    except (RecursionError, MemoryError, TypeError, ValueError, KeyError, AttributeError, IndexError,
            _Break, _Continue, _Return) as exc:
        # bounded evaluation of arbitrary syntax: whatever slips past the bounds is "not read", never a crash
        return Reference("unread", f"not evaluated ({type(exc).__name__})")
