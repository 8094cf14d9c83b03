"""The joint head for a plugin version: the config it builds ``JointSchemaHead(**config)`` from, and
the head file checked against the head the plugin itself builds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Union

from clef_format.errors import IncompatibleError
from clef_format.spec.layouts import HEAD_CONFIG
from clef_format.spec.marker import without_marker
from clef_format.vllm.gate import CheckpointSource, OnRefusal, gate_or_report

if TYPE_CHECKING:
    from clef_format.read.checkpoint import Checkpoint

#: The plugin's own head: its class (called as ``JointSchemaHead(**config)`` on the meta device), a
#: module already built, or a state_dict-like mapping of names to tensors or shapes.
PluginHead = Union[Callable[..., Any], Mapping[str, Any], Any]
_FIX = "re-download the joint head files of this revision, or install the plugin these weights were made for"


def head_config(source: CheckpointSource, plugin_version: str, on_refusal: OnRefusal = None) -> dict[str, Any]:
    """The head config without the marker, after the (checkpoint, plugin version) pair is checked.

    Refuses (``IncompatibleError``) what ``check_checkpoint`` refuses, which includes a config that the
    checkpoint's own ``JointSchemaHead`` would reject (``head-incomplete``, ``head-unexpected``): the
    gate is the one judge, so a key the reference file's head takes is served, not refused by a guess.
    The marker is taken out because the head's constructor does not accept it: it exists precisely to
    break plugins that do not remove it. ``on_refusal``: see ``gate.gate_or_report`` (a refusal handed
    over: the config as read, ``{}`` for one that is not a JSON object; for tests only).
    """
    return _config_of(gate_or_report(source, plugin_version, on_refusal))


def _refuse(exc: IncompatibleError, on_refusal: OnRefusal) -> None:
    if on_refusal is None:
        raise exc
    on_refusal(exc)


def _config_of(ck: "Checkpoint") -> dict[str, Any]:
    raw = ck.head_config
    return without_marker(raw) if isinstance(raw, dict) else {}


def _constructor_refusal(head: Any, config: Mapping[str, Any]) -> IncompatibleError | None:
    """What ``head(**config)`` would raise for the config's keys, read from the plugin's own class's
    signature (a fact, unlike any list of expected keys): a key it does not take, or one it needs."""
    import inspect

    try:
        inspect.signature(head).bind(**config)
    except TypeError as exc:
        unexpected = "unexpected keyword" in str(exc)
        return IncompatibleError("head-unexpected" if unexpected else "head-incomplete",
                                 f"{HEAD_CONFIG}: the plugin's JointSchemaHead(**config) refuses it: {exc}", _FIX)
    except ValueError:  # no signature to read (a builtin): the call itself decides
        return None
    return None


def plugin_head_shapes(head: PluginHead, config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the plugin's head at this config. A class is built on torch's meta device
    (no memory, no data): its ``state_dict`` is exactly what ``load_state_dict`` will demand. A config
    the class's constructor does not take is refused (``IncompatibleError``) before it is called."""
    if isinstance(head, Mapping):
        given: Mapping[str, Any] = head
        return {k: tuple(getattr(v, "shape", v)) for k, v in given.items()}
    module: Any = head
    if isinstance(head, type) or not hasattr(head, "state_dict"):
        if not callable(head):
            from clef_format.errors import UsageError

            raise UsageError(f"head {head!r} ({type(head).__name__}) is not a head",
                             fix="pass the plugin's JointSchemaHead class, a module built from it, or its state_dict")
        refusal = _constructor_refusal(head, config)
        if refusal is not None:
            raise refusal
        module = _built(head, config)
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def _built(head: Callable[..., Any], config: Mapping[str, Any]) -> Any:
    """``head(**config)`` on torch's meta device (no memory); a constructor that needs real data (``.item()``
    in ``__init__``) is built on the CPU instead; one that raises on both is refused with what it raised."""
    import torch

    try:
        with torch.device("meta"):
            return head(**config)
    except Exception:  # noqa: BLE001 - the plugin's own code: whatever it raises is judged on the CPU
        pass
    try:
        return head(**config)
    except Exception as exc:  # noqa: BLE001 - a refusal with its code, never a traceback at start
        raise IncompatibleError("head-config-invalid", f"{HEAD_CONFIG}: the plugin's JointSchemaHead(**config) "
                                f"raises {type(exc).__name__}: {exc}", _FIX) from None


def check_plugin_head(source: CheckpointSource, plugin_version: str, head: PluginHead,
                      on_refusal: OnRefusal = None) -> "Checkpoint":
    """Refuse (``IncompatibleError``) a checkpoint whose head file is not exactly the plugin's own head.

    Runs ``check_checkpoint`` first (every error of verify, the reference file's reading included),
    then compares the head file's names and shapes with ``plugin_head_shapes(head, config)``: a tensor
    the plugin's head lacks or holds, or of another shape, is refused with the code verify gives it
    (``head-incomplete``, ``head-unexpected``). Returns the checkpoint read. ``on_refusal``: see
    ``gate.gate_or_report`` (refusals handed over instead of raised: for tests only).
    """
    from clef_format.spec import layouts as L
    from clef_format.verify.checks.head import exact_problems

    ck = gate_or_report(source, plugin_version, on_refusal)
    weights, _ = L.head_files(ck.layout)
    header = ck.headers.get(weights)
    if header is None:
        _refuse(IncompatibleError("missing-file", f"{weights} is missing", _FIX), on_refusal)
        return ck
    try:
        want = plugin_head_shapes(head, _config_of(ck))
    except IncompatibleError as exc:
        _refuse(exc, on_refusal)
        return ck
    tensors = {n: (i.dtype, i.shape) for n, i in header.tensors.items()}
    problems = exact_problems(want, tensors, builder="the plugin's JointSchemaHead")
    if problems:
        first = problems[0]
        code = "head-unexpected" if first.kind == "unexpected" else "head-incomplete"
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        _refuse(IncompatibleError(code, f"{weights}: {first.message}{more}", _FIX), on_refusal)
    return ck
