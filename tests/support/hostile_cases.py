"""The hostile-input corpus: builders that damage a copy of a valid checkpoint, one way each.

Kept as code, not binary blobs: each case says what it breaks, which finding code verify must
give, and (for safetensors-level corruption) which file must be rejected exactly as safetensors'
own ``safe_open`` rejects it. ``pristine()`` builds the valid layout-2 checkpoint once per process.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import pickle
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any, Callable, NamedTuple

from clef_format.read.safetensors import read_header
from clef_format.spec import layouts as L

BACKBONE = L.BACKBONE_SINGLE
HEAD = L.HEAD_WEIGHTS
TABLES = L.TABLES


class Case(NamedTuple):
    name: str
    build: Callable[[Path], None]  # damages the checkpoint copy at its argument
    code: str  # the finding code verify must report
    deep: bool = False  # needs --deep
    st_file: str | None = None  # safetensors-level corruption: the file to compare with safe_open
    parity: bool = True  # False where clef-format is deliberately stricter than safe_open (documented)


@functools.lru_cache(maxsize=1)
def pristine() -> Path:
    """A valid tiny layout-2 hybrid (FP8 + NVFP4) checkpoint, built once per process."""
    from clef_format.fixtures.builders import build_checkpoint

    base = tempfile.mkdtemp(prefix="clef-pristine-")
    atexit.register(shutil.rmtree, base, ignore_errors=True)
    root = Path(base) / "ck"
    build_checkpoint(root, "layout-2", "hybrid", num_layers=8)
    return root


def fresh_copy(dest: Path) -> Path:
    shutil.copytree(pristine(), dest, symlinks=True)
    return dest


# ---------------------------------------------------------------- byte-level helpers

def split_file(path: Path) -> tuple[dict[str, Any], bytes]:
    """(header JSON object, data buffer) of a valid safetensors file."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_raw(path: Path, header: bytes, data: bytes = b"", length: int | None = None) -> None:
    """Write ``length`` (default: the header's length) as the prefix, then header and data, verbatim."""
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)


def write_header(path: Path, header: Any, data: bytes, pad: bool = True) -> None:
    raw = json.dumps(header, separators=(",", ":")).encode() if not isinstance(header, bytes) else header
    if pad:
        raw += b" " * (-len(raw) % 8)
    write_raw(path, raw, data)


def edit_header(rel: str, fn: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    """A builder that rewrites the JSON header of ``rel`` (data untouched)."""
    def build(root: Path) -> None:
        header, data = split_file(root / rel)
        out = fn(header)
        write_header(root / rel, header if out is None else out, data)
    return build


def first_tensor(header: dict[str, Any]) -> str:
    return min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


def last_tensor(header: dict[str, Any]) -> str:
    return max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])


def set_f32(rel: str, tensor_suffix: str, value: float, index: int = 0) -> Callable[[Path], None]:
    """Overwrite element ``index`` of the first F32 tensor whose name ends with ``tensor_suffix``."""
    def build(root: Path) -> None:
        h = read_header(root / rel)
        name = next(n for n, t in h.tensors.items() if n.endswith(tensor_suffix) and t.dtype == "F32")
        with open(root / rel, "r+b") as fh:
            fh.seek(h.data_start + h.tensors[name].begin + 4 * index)
            fh.write(struct.pack("<f", value))
    return build


def set_byte(rel: str, tensor_suffix: str, dtype: str, value: int, index: int = 0) -> Callable[[Path], None]:
    """Overwrite byte ``index`` of the first ``dtype`` tensor whose name ends with ``tensor_suffix``."""
    def build(root: Path) -> None:
        h = read_header(root / rel)
        name = next(n for n, t in h.tensors.items() if n.endswith(tensor_suffix) and t.dtype == dtype)
        with open(root / rel, "r+b") as fh:
            fh.seek(h.data_start + h.tensors[name].begin + index)
            fh.write(bytes([value]))
    return build


def _drop_layer_types(c: dict[str, Any], n: int) -> None:
    c["text_config"].pop("layer_types", None)
    c["text_config"]["num_hidden_layers"] = n


def truncate(rel: str, keep: int | None = None, cut: int = 0) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        p = root / rel
        size = p.stat().st_size
        with open(p, "r+b") as fh:
            fh.truncate(keep if keep is not None else size - cut)
    return build


def replace_bytes(rel: str, content: bytes) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        (root / rel).write_bytes(content)
    return build


def prefix_length(rel: str, n: int) -> Callable[[Path], None]:
    """Overwrite the 8-byte header length with ``n``."""
    def build(root: Path) -> None:
        with open(root / rel, "r+b") as fh:
            fh.write(struct.pack("<Q", n))
    return build


def huge_sparse_claim(rel: str, claim: int, size: int) -> Callable[[Path], None]:
    """A sparse file of ``size`` bytes whose prefix claims a ``claim``-byte header (costs no disk)."""
    def build(root: Path) -> None:
        p = root / rel
        with open(p, "wb") as fh:
            fh.write(struct.pack("<Q", claim) + b"{")
            fh.truncate(size)
    return build


def raw_header(rel: str, header: bytes, keep_data: bool = True, length: int | None = None) -> Callable[[Path], None]:
    """Replace the header of ``rel`` with exact bytes (no padding), keeping or dropping the data."""
    def build(root: Path) -> None:
        _, data = split_file(root / rel)
        write_raw(root / rel, header, data if keep_data else b"", length)
    return build


def json_file(rel: str, obj: Any = None, text: bytes | None = None) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(text if text is not None else json.dumps(obj).encode())
    return build


def edit_json(rel: str, fn: Callable[[Any], Any]) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        p = root / rel
        obj = json.loads(p.read_text())
        out = fn(obj)
        p.write_text(json.dumps(obj if out is None else out))
    return build


def with_index(extra: dict[str, str] | None = None, raw: bytes | None = None,
               weight_map: Any = None) -> Callable[[Path], None]:
    """Add a model.safetensors.index.json mapping every backbone tensor to model.safetensors, plus ``extra``."""
    def build(root: Path) -> None:
        p = root / L.BACKBONE_INDEX
        if raw is not None:
            p.write_bytes(raw)
            return
        names = read_header(root / BACKBONE).tensors
        wm = weight_map if weight_map is not None else {**{n: BACKBONE for n in names}, **(extra or {})}
        p.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": wm}))
    return build


def symlink(rel: str, target_fn: Callable[[Path], str]) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        p = root / rel
        if p.is_symlink() or p.is_file():
            p.unlink()
        elif p.is_dir():
            shutil.rmtree(p)
        os.symlink(target_fn(root), p)
    return build


def outside_copy(rel: str) -> Callable[[Path], str]:
    """A valid copy of ``rel`` placed next to (outside) the checkpoint: the link target."""
    def target(root: Path) -> str:
        dest = root.parent / ("outside-" + rel.replace("/", "_"))
        if (pristine() / rel).is_dir():
            shutil.copytree(pristine() / rel, dest)
        else:
            shutil.copyfile(pristine() / rel, dest)
        return str(dest)
    return target


def mkfifo(rel: str) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        (root / rel).unlink()
        os.mkfifo(root / rel)
    return build


def sparse_file(rel: str, size: int, start: bytes = b"{") -> Callable[[Path], None]:
    def build(root: Path) -> None:
        with open(root / rel, "wb") as fh:
            fh.write(start)
            fh.truncate(size)
    return build


def retable_vocab(vocab: int) -> Callable[[Path], None]:
    """Rewrite the tables file with ``vocab`` rows (a tables file made for another vocabulary)."""
    def build(root: Path) -> None:
        header, data = split_file(root / TABLES)
        meta = header.pop("__metadata__", None)
        out: dict[str, Any] = {"__metadata__": meta} if meta else {}
        offset, chunks = 0, []
        for name, e in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            shape = [vocab] + e["shape"][1:]
            per_row = (e["data_offsets"][1] - e["data_offsets"][0]) // e["shape"][0]
            size = per_row * vocab
            chunks.append(data[e["data_offsets"][0]:e["data_offsets"][0] + size])
            out[name] = {"dtype": e["dtype"], "shape": shape, "data_offsets": [offset, offset + size]}
            offset += size
        write_header(root / TABLES, out, b"".join(chunks))
    return build


def write_manifest_then(damage: Callable[[Path], None]) -> Callable[[Path], None]:
    """Write a real manifest with the CLI, then damage the checkpoint."""
    def build(root: Path) -> None:
        from clef_format.cli.main import main

        assert main(["manifest", str(root)]) == 0
        damage(root)
    return build


def flip_byte(rel: str, at: int) -> Callable[[Path], None]:
    def build(root: Path) -> None:
        p = root / rel
        size = p.stat().st_size
        with open(p, "r+b") as fh:
            fh.seek(at % size)
            b = fh.read(1)
            fh.seek(at % size)
            fh.write(bytes([b[0] ^ 0x55]))
    return build


def _entry(**kw: Any) -> dict[str, Any]:
    return {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], **kw}


def _hdr(d: dict[str, Any]) -> bytes:
    return json.dumps(d).encode()


# ---------------------------------------------------------------- the corpus

def _mutate_first(fn: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def edit(h: dict[str, Any]) -> None:
        fn(h[first_tensor(h)])
    return edit


_MB = 1024 * 1024

CASES: list[Case] = [
    # --- safetensors-level corruption (compared with safe_open) -------------------------------
    Case("truncated-tail", truncate(BACKBONE, cut=100), "bad-header", st_file=BACKBONE),
    Case("truncated-inside-header", truncate(BACKBONE, keep=64), "bad-header", st_file=BACKBONE),
    Case("shorter-than-prefix", truncate(BACKBONE, keep=4), "bad-header", st_file=BACKBONE),
    Case("empty-file", truncate(BACKBONE, keep=0), "bad-header", st_file=BACKBONE),
    Case("header-length-past-eof", prefix_length(BACKBONE, 10 * _MB), "bad-header", st_file=BACKBONE),
    Case("header-claims-over-100mb", prefix_length(BACKBONE, 100_000_001), "bad-header", st_file=BACKBONE),
    Case("header-claims-over-100mb-sparse-huge", huge_sparse_claim(BACKBONE, 150_000_000, 300 * _MB), "bad-header",
         st_file=BACKBONE),
    Case("header-length-u64-max", prefix_length(BACKBONE, 2**64 - 1), "bad-header", st_file=BACKBONE),
    Case("header-not-utf8", raw_header(HEAD, b'{"\xff\xfe":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}}',
                                       keep_data=False), "bad-header", st_file=HEAD),
    Case("header-not-json", raw_header(HEAD, b"{this is not json}   ", keep_data=False), "bad-header", st_file=HEAD),
    Case("header-json-array", raw_header(HEAD, b"[]      ", keep_data=False), "bad-header", st_file=HEAD),
    Case("header-json-string", raw_header(HEAD, b'"abc"   ', keep_data=False), "bad-header", st_file=HEAD),
    Case("header-leading-space", raw_header(HEAD, b" " + _hdr({"a": _entry()}), keep_data=False), "bad-header",
         st_file=HEAD),
    Case("header-nul-padding", raw_header(HEAD, _hdr({"a": {**_entry(), "data_offsets": [0, 0], "shape": [0]}})
                                         + b"\0\0\0\0", keep_data=False), "bad-header", st_file=HEAD),
    Case("duplicate-tensor-key", raw_header(
        HEAD, b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
              b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', keep_data=False), "bad-header",
         st_file=HEAD, parity=False),
    Case("duplicate-entry-field", raw_header(
        HEAD, b'{"a":{"dtype":"F32","dtype":"I8","shape":[0],"data_offsets":[0,0]}}', keep_data=False),
         "bad-header", st_file=HEAD, parity=False),
    Case("overlapping-offsets", edit_header(HEAD, lambda h: h[last_tensor(h)]["data_offsets"].__setitem__(
        0, h[last_tensor(h)]["data_offsets"][0] - 2)), "bad-header", st_file=HEAD),
    Case("gapped-offsets", edit_header(HEAD, lambda h: [e["data_offsets"].__setitem__(slice(None), [
        e["data_offsets"][0] + 4, e["data_offsets"][1] + 4]) for k, e in h.items() if k != "__metadata__"
        and e["data_offsets"][0] > 0]), "bad-header", st_file=HEAD),
    Case("offsets-not-from-zero", raw_header(HEAD, _hdr({"a": _entry(data_offsets=[4, 12])}) , keep_data=False),
         "bad-header", st_file=HEAD),
    Case("end-before-begin", edit_header(HEAD, _mutate_first(lambda e: e.__setitem__(
        "data_offsets", [e["data_offsets"][1], e["data_offsets"][0]]))), "bad-header", st_file=HEAD),
    Case("numel-overflow", raw_header(HEAD, _hdr({"a": _entry(shape=[2**40, 2**40, 2**40])}), keep_data=False),
         "bad-header", st_file=HEAD),
    Case("bytes-overflow", raw_header(HEAD, _hdr({"a": _entry(shape=[2**62, 8])}), keep_data=False), "bad-header",
         st_file=HEAD),
    Case("negative-shape", raw_header(HEAD, _hdr({"a": _entry(shape=[-2])}), keep_data=False), "bad-header",
         st_file=HEAD),
    Case("shape-dim-over-u64", raw_header(HEAD, _hdr({"a": _entry(shape=[2**70])}), keep_data=False),
         "bad-header", st_file=HEAD),
    Case("float-shape", raw_header(HEAD, _hdr({"a": _entry(shape=[2.0])}), keep_data=False), "bad-header",
         st_file=HEAD),
    Case("unknown-dtype", raw_header(HEAD, _hdr({"a": _entry(dtype="F128")}), keep_data=False), "bad-header",
         st_file=HEAD),
    Case("dtype-not-string", raw_header(HEAD, _hdr({"a": _entry(dtype=32)}), keep_data=False), "bad-header",
         st_file=HEAD),
    Case("offsets-three-values", raw_header(HEAD, _hdr({"a": _entry(data_offsets=[0, 4, 8])}), keep_data=False),
         "bad-header", st_file=HEAD),
    Case("offset-negative", raw_header(HEAD, _hdr({"a": _entry(data_offsets=[-8, 0])}), keep_data=False),
         "bad-header", st_file=HEAD),
    Case("metadata-non-string", edit_header(HEAD, lambda h: h.__setitem__("__metadata__", {"format": 1})),
         "bad-header", st_file=HEAD),
    Case("metadata-not-object", edit_header(HEAD, lambda h: h.__setitem__("__metadata__", ["pt"])),
         "bad-header", st_file=HEAD),
    Case("trailing-bytes", lambda root: (root / HEAD).open("ab").write(b"\0" * 16), "bad-header", st_file=HEAD),
    Case("entry-not-object", raw_header(HEAD, _hdr({"a": [0, 8]}), keep_data=False), "bad-header", st_file=HEAD),
    Case("entry-missing-offsets", raw_header(HEAD, _hdr({"a": {"dtype": "F32", "shape": [0]}}), keep_data=False),
         "bad-header", st_file=HEAD),
    Case("nested-json-bomb", raw_header(HEAD, b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}", keep_data=False),
         "bad-header", st_file=HEAD),
    Case("nan-literal-offset", raw_header(HEAD, b'{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,NaN]}}',
                                          keep_data=False), "bad-header", st_file=HEAD),
    Case("size-mismatch", edit_header(HEAD, _mutate_first(lambda e: e.__setitem__("shape", e["shape"] + [2]))),
         "bad-header", st_file=HEAD),
    Case("pickle-named-safetensors", replace_bytes(BACKBONE, pickle.dumps({"weight": [1.0] * 64})), "bad-header",
         st_file=BACKBONE),
    Case("tables-truncated", truncate(TABLES, cut=4096), "bad-header", st_file=TABLES),
    Case("random-bytes-head", replace_bytes(HEAD, bytes(range(256)) * 64), "bad-header", st_file=HEAD),
    # --- scales and shapes ------------------------------------------------------------------
    Case("nan-table-scale", set_f32(TABLES, "_scale", float("nan"), 3), "nonfinite-scale"),
    Case("inf-table-scale", set_f32(TABLES, "_scale", float("inf"), 7), "nonfinite-scale"),
    Case("negative-table-scale", set_f32(TABLES, "_scale", -0.5, 1), "nonfinite-scale"),
    Case("huge-table-scale", set_f32(TABLES, "_scale", 1e37, 2), "scale-range", deep=True),
    Case("nan-backbone-scale", set_f32(BACKBONE, ".weight_scale", float("nan"), 5), "nonfinite-scale", deep=True),
    Case("inf-backbone-scale", set_f32(BACKBONE, ".weight_scale", float("-inf"), 0), "nonfinite-scale", deep=True),
    Case("negative-backbone-scale", set_f32(BACKBONE, ".weight_scale", -1.0, 0), "scale-range", deep=True),
    Case("nan-nvfp4-group-scale", set_byte(BACKBONE, ".weight_scale", "F8_E4M3", 0x7F, 9), "nonfinite-scale",
         deep=True),
    Case("negative-nvfp4-group-scale", set_byte(BACKBONE, ".weight_scale", "F8_E4M3", 0xB8, 4), "scale-range",
         deep=True),
    Case("zero-global-scale", set_f32(BACKBONE, ".weight_global_scale", 0.0, 0), "scale-range", deep=True),
    Case("nan-global-scale", set_f32(BACKBONE, ".weight_global_scale", float("nan"), 0), "nonfinite-scale"),
    Case("negative-global-scale", set_f32(BACKBONE, ".weight_global_scale", -448.0, 0), "scale-range"),
    Case("inf-input-global-scale", set_f32(BACKBONE, ".input_global_scale", float("inf"), 0), "nonfinite-scale"),
    Case("wrong-vocab-tables", retable_vocab(500), "table-shape"),
    Case("wrong-vocab-config", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__("vocab_size", 1024)),
         "table-shape"),
    Case("wrong-hidden-config", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__("hidden_size", 96)),
         "tensor-shape"),
    # --- the index ---------------------------------------------------------------------------
    Case("index-path-traversal", with_index({"x.weight": "../../../etc/passwd"}), "path-escape"),
    Case("index-absolute-path", with_index({"x.weight": "/etc/passwd"}), "path-escape"),
    Case("index-backslash-path", with_index({"x.weight": "..\\..\\secret.safetensors"}), "path-escape"),
    Case("index-dotdot-inside", with_index({"x.weight": "clef_head/../../outside.safetensors"}), "path-escape"),
    Case("index-not-json", with_index(raw=b"{\"weight_map\": "), "bad-config"),
    Case("index-weight-map-list", with_index(weight_map=["model.safetensors"]), "bad-config"),
    Case("index-value-not-string", with_index(weight_map={"a": 3}), "bad-config"),
    Case("index-dot-slash-entry", lambda root: with_index(weight_map={
        n: f"./{BACKBONE}" for n in read_header(root / BACKBONE).tensors})(root), "index-mismatch"),
    Case("index-dotdot-stays-inside", lambda root: with_index(weight_map={
        n: f"clef_head/../{BACKBONE}" for n in read_header(root / BACKBONE).tensors})(root), "index-mismatch"),
    Case("index-missing-shard", with_index({"x.weight": "model-00002-of-00002.safetensors"}), "missing-file"),
    # --- symlinks and special files ----------------------------------------------------------
    Case("symlink-file-outside", symlink(BACKBONE, outside_copy(BACKBONE)), "path-escape"),
    Case("symlink-dir-outside", symlink(L.HEAD_DIR, outside_copy(L.HEAD_DIR)), "path-escape"),
    Case("symlink-dev-zero", symlink(BACKBONE, lambda root: "/dev/zero"), "path-escape"),
    Case("symlink-absolute-etc", symlink(L.CONFIG, lambda root: "/etc/hostname"), "path-escape"),
    Case("symlink-loop", symlink(L.CONFIG, lambda root: L.CONFIG), "missing-file"),
    Case("fifo-config", mkfifo(L.CONFIG), "special-file"),  # there, never opened: not missing
    # the type before the name: a FIFO is never taken for a pickle or an unfinished download (nor opened)
    Case("fifo-named-like-a-pickle", lambda root: os.mkfifo(root / "pytorch_model.bin"), "special-file"),
    Case("fifo-named-like-a-partial-download", lambda root: os.mkfifo(root / "model.safetensors.incomplete"),
         "special-file"),
    # --- pickle ------------------------------------------------------------------------------
    Case("pickle-bin-present", replace_bytes("pytorch_model.bin", pickle.dumps({"a": 1})), "unsafe-file"),
    Case("pickle-pt-in-head", replace_bytes("clef_head/joint_head.pt", pickle.dumps({"a": 1})), "unsafe-file"),
    Case("marker-key-twice", replace_bytes(L.HEAD_CONFIG, b'{"requires_clef_vllm": "==0.1.4", "requires_clef_vllm": '
                                                            b'">=0.2.0"}'), "bad-config"),
    Case("config-key-twice", lambda root: (root / "config.json").write_text(
        (root / "config.json").read_text().replace('{', '{"model_type": "llama", ', 1)), "bad-config"),
    Case("stray-root-safetensors", lambda root: shutil.copy(root / BACKBONE, root / "adapter.safetensors"),
         "stray-weights"),
    Case("stray-root-shard-name", lambda root: shutil.copy(root / BACKBONE, root / "model-00001-of-00002.safetensors"),
         "stray-weights"),
    Case("pickle-upper-case-suffix", replace_bytes("x.PT", pickle.dumps({"a": 1})), "unsafe-file"),
    Case("pickle-mixed-case-suffix", replace_bytes("pytorch_model.Bin", pickle.dumps({"a": 1})), "unsafe-file"),
    Case("pickle-ckpt", replace_bytes("model.ckpt", b"\x80\x04K\x01."), "unsafe-file"),
    # --- config.json -------------------------------------------------------------------------
    Case("config-not-json", json_file(L.CONFIG, text=b"{'architectures': nope"), "bad-config"),
    Case("config-not-utf8", json_file(L.CONFIG, text=b'{"a": "\xff\xfe"}'), "bad-config"),
    Case("config-array", json_file(L.CONFIG, [1, 2, 3]), "bad-config"),
    Case("config-wrong-types", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__("hidden_size", "64")),
         "bad-config"),
    Case("config-bool-int", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__("num_hidden_layers", True)),
         "bad-config"),
    Case("config-huge-int", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__("num_hidden_layers", 10**30)),
         "bad-config"),
    Case("config-layer-count-hang", edit_json(L.CONFIG, lambda c: _drop_layer_types(c, 2**40)), "bad-config"),
    Case("config-vision-depth-hang", edit_json(L.CONFIG, lambda c: c["vision_config"].__setitem__("depth", 2**40)),
         "bad-config"),
    Case("config-nan", json_file(L.CONFIG, text=b'{"architectures": ["X"], "hidden_size": NaN}'), "bad-config"),
    Case("config-text-config-list", edit_json(L.CONFIG, lambda c: c.__setitem__("text_config", [])), "bad-config"),
    Case("config-huge-file", sparse_file(L.CONFIG, 64 * _MB), "bad-config"),
    Case("config-nested-bomb", json_file(L.CONFIG, text=b"[" * 200_000 + b"]" * 200_000), "bad-config"),
    # values transformers' strict config classes refuse by JSON type alone (vllm_rules/config_types.py)
    Case("config-tie-string", edit_json(L.CONFIG, lambda c: c.__setitem__("tie_word_embeddings", "true")),
         "config-invalid"),
    Case("config-tie-int", edit_json(L.CONFIG, lambda c: c.__setitem__("tie_word_embeddings", 1)), "config-invalid"),
    Case("config-eps-string", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__("rms_norm_eps", "1e-6")),
         "config-invalid"),
    Case("config-eps-int", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__("rms_norm_eps", 0)),
         "config-invalid"),
    Case("config-max-positions-string", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__(
        "max_position_embeddings", "32768")), "config-invalid"),
    Case("config-text-dtype-unknown", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__("dtype", "x")),
         "bad-config"),
    Case("config-gate-string", edit_json(L.CONFIG, lambda c: c["text_config"].__setitem__("attn_output_gate", "false")),
         "bad-config"),
    Case("config-vision-null", edit_json(L.CONFIG, lambda c: c.__setitem__("vision_config", None)), "bad-config"),
    # --- the version marker ------------------------------------------------------------------
    Case("marker-invalid-specifier", edit_json(L.HEAD_CONFIG, lambda c: c.__setitem__(L.MARKER_KEY, "~=banana")),
         "marker-invalid"),
    Case("marker-not-string", edit_json(L.HEAD_CONFIG, lambda c: c.__setitem__(L.MARKER_KEY, 2)), "marker-invalid"),
    Case("marker-empty", edit_json(L.HEAD_CONFIG, lambda c: c.__setitem__(L.MARKER_KEY, "")), "marker-invalid"),
    Case("marker-huge", edit_json(L.HEAD_CONFIG, lambda c: c.__setitem__(L.MARKER_KEY, ">=0.2.0," * 20_000 + "~")),
         "marker-invalid"),
    Case("marker-null", edit_json(L.HEAD_CONFIG, lambda c: c.__setitem__(L.MARKER_KEY, None)), "marker-invalid"),
    # --- the joint head config ---------------------------------------------------------------
    Case("head-config-unknown-keys", edit_json(L.HEAD_CONFIG, lambda c: c.update(dropout=0.1, exec="rm -rf /")),
         "head-unexpected"),
    Case("head-config-missing-keys", edit_json(L.HEAD_CONFIG, lambda c: c.__delitem__("width")), "head-incomplete"),
    Case("head-config-negative", edit_json(L.HEAD_CONFIG, lambda c: c.__setitem__("layers", -4)), "head-incomplete"),
    Case("head-config-layers-hang", edit_json(L.HEAD_CONFIG, lambda c: c.__setitem__("layers", 2**31)),
         "head-incomplete"),
    Case("head-config-bool", edit_json(L.HEAD_CONFIG, lambda c: c.__setitem__("heads", True)), "head-incomplete"),
    Case("head-config-not-json", json_file(L.HEAD_CONFIG, text=b"hidden_size=4096"), "bad-config"),
    Case("head-config-truncated", lambda root: (root / L.HEAD_CONFIG).write_bytes(
        (root / L.HEAD_CONFIG).read_bytes()[:-2]), "bad-config"),
    Case("head-config-empty", replace_bytes(L.HEAD_CONFIG, b""), "bad-config"),
    # not an object: no config, no marker (the layout unknown)
    Case("head-config-array", json_file(L.HEAD_CONFIG, [4096, 1024]), "bad-config"),
    # --- downloads and deep verification -----------------------------------------------------
    Case("incomplete-download", replace_bytes("model-00002-of-00002.safetensors.incomplete", b"\0" * 64),
         "partial-download"),
    Case("manifest-hash-mismatch", write_manifest_then(flip_byte(BACKBONE, 5000)), "hash-mismatch", deep=True),
    Case("manifest-size-mismatch", write_manifest_then(lambda r: (r / "tokenizer.json").open("a").write(" ")),
         "hash-mismatch", deep=True),
    Case("manifest-path-traversal", json_file("clef_manifest.json", {
        "clef_manifest": 1, "algorithm": "blake3",
        "files": {"../../etc/passwd": {"size": 1, "blake3": "0" * 64}}}), "path-escape", deep=True),
    Case("manifest-key-twice", json_file("clef_manifest.json", text=(
        b'{"clef_manifest": 1, "algorithm": "blake3", "files": {}, "files": {}}')), "bad-config", deep=True),
    Case("manifest-not-json", json_file("clef_manifest.json", text=b"\x00\x01garbage"), "bad-config", deep=True),
    Case("manifest-lists-missing-file", write_manifest_then(lambda r: (r / "chat_template.jinja").unlink()),
         "missing-file", deep=True),
]

CASES_BY_NAME = {c.name: c for c in CASES}

#: Strictness no loader needs: each is reported as a warning with its code, and verify exits 0
#: (a key twice with the same value every reader agrees on; provenance metadata of the tables file).
NOTE_CASES: list[Case] = [
    Case("head-config-key-twice-same-value", lambda root: (root / L.HEAD_CONFIG).write_text(
        (root / L.HEAD_CONFIG).read_text().replace('{', '{"heads": 4, ', 1)), "bad-config"),
    Case("tables-quality-empty", edit_header(TABLES, lambda h: h["__metadata__"].update(quality="{}")), "tables-metadata"),
    Case("tables-quality-not-figures", edit_header(TABLES, lambda h: h["__metadata__"].update(
        quality='{"lm_head.weight": 5, "model.language_model.embed_tokens.weight": {}}')), "tables-metadata"),
    Case("tables-source-dtype-int", edit_header(TABLES, lambda h: h["__metadata__"].update(source_dtype="I8")),
         "tables-metadata"),
    Case("tables-framework-tag-np", edit_header(TABLES, lambda h: h["__metadata__"].update(format="np")),
         "tables-metadata"),
]
assert len(CASES_BY_NAME) == len(CASES), "case names must be unique"


# ---------------------------------------------------------------- the two readers, as booleans

def safe_open_accepts(path: Path) -> bool:
    """Whether safetensors' own reader opens the file and reads every tensor's shape."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as f:
            for k in f.keys():
                f.get_slice(k).get_shape()
        return True
    except Exception:  # SafetensorError, or OSError for a file too short to map
        return False


def ours_accepts(path: Path) -> bool:
    """Whether clef-format's header reader accepts the file (it raises nothing but HeaderError)."""
    from clef_format.read.safetensors import HeaderError, read_header

    try:
        read_header(path)
        return True
    except HeaderError:
        return False
