"""The exhaustive mutation suite: every structural change of a valid checkpoint must be reported.

For every build (nvfp4, fp8, hybrid, mixed, bf16) in every layout (layout-1, layout-2,
layout-2-unmarked; original-release, which is BF16 only), single-file and sharded, the mutations are
generated from what the spec made the builders write, never listed by hand:

* ``delete``:      remove each tensor (backbone, joint head, int8 tables);
* ``dtype-same``:  change each tensor's dtype to another of the same width;
* ``dtype-other``: change it to one of another width;
* ``shape``:       change each shape (last dimension + 1; a 0-dim scalar becomes [1]);
* ``add``:         add a tensor beside each module (a bias where it has none, else a zero point);
* ``config-remove`` / ``config-alter``: remove each key of config.json and of the joint head
  config, or alter it within its type (int + 1, float x 2 + 1, bool negated, string changed, list shortened;
  a one-name list gets another name).

Each must yield an error that names the tensor, its module or the key (a float tensor given another float
dtype: the ``dtype-cast`` warning naming it, both loaders casting it). Sampling, to fit a few
minutes on two cores (about 3 minutes for the whole table in one process on the shared 2-core box,
the 32 checkpoints split over ``-n 2`` in the main tier): within one checkpoint, tensors (and modules)
that differ only in their layer index and have the same dtype and shape are one *role*, and each
role is mutated once; the checkpoints in ``PRIMARY`` (every build in layout-2, single file, plus
two sharded ones) get every role and every config key, each other checkpoint one mutation in
``SAMPLE`` (by a hash of the target), so every build x layout x sharding is covered. Edits are made on
headers (``header_edit``, data left sparse) and verify runs in-process. The detection rate per class
is printed (``python -m tests.scenarios.test_mutations`` prints the whole table, and the listed
entries no miss used). Every miss must be listed in ``INDISTINGUISHABLE`` with the reason it cannot
be told apart from a valid checkpoint (each reason checked against vLLM 0.28 / 0.33 and transformers),
or in ``KNOWN_GAPS`` (detectable, not caught: empty now).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from clef_format.fixtures.builders import BUILDS, build_checkpoint
from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.verify.run import verify_checkpoint
from tests.support.header_edit import Snapshot, edit_file, edit_json, entries, sparsify

WIDTHS = {8: ["I8", "U8", "F8_E4M3", "F8_E5M2"], 16: ["BF16", "F16", "I16", "U16"], 32: ["F32", "I32", "U32"],
          64: ["F64", "I64"]}
BITS = {d: w for w, ds in WIDTHS.items() for d in ds}
OTHER = {8: "BF16", 16: "F32", 32: "BF16", 64: "F32"}

#: Mutations that cannot be told apart from a valid checkpoint: (class, regex on the target) -> reason.
#: Each reason was checked against the vLLM 0.28.0 / 0.33.0 wheels with the compressed-tensors 0.17.0 they
#: pin, and transformers 5.20 / 5.24 (docs/FORMAT.md, "What verify checks"); a reason is used only for a
#: mutation verify did not detect.
INDISTINGUISHABLE: dict[tuple[str, str], str] = {
    ("dtype-other", r"\.(weight_scale|input_scale)$"):
        "an FP8 scale stored in the model's dtype (BF16) instead of F32: compressed-tensors writes either, vLLM "
        "loads either into its F32 scale",
    # removed keys whose transformers default (Qwen3_5Config / Qwen3_5TextConfig / Qwen3_5VisionConfig) is the value
    ("config-remove", r"^(text_config\.)?layer_types$"):
        "transformers derives it from full_attention_interval (default 4): the same list",
    ("config-remove", r"^vision_config\.(in_channels|temporal_patch_size|spatial_merge_size|hidden_act)$"):
        "its transformers default (3, 2, 2, gelu_pytorch_tanh) is the value",
    ("config-remove", r"^text_config\.(hidden_act|rms_norm_eps|max_position_embeddings|attention_bias|"
                      r"tie_word_embeddings|rope_parameters(\..*)?)$"):
        "its transformers default (silu, 1e-6, 32768, false, false; rope_type default, rope_theta 10000, "
        "partial_rotary_factor 0.25) is the value",
    ("config-remove", r"^tie_word_embeddings$"): "its transformers default (false) is the value",
    ("config-remove", r"^(text_config|vision_config)\.model_type$"):
        "transformers builds text_config / vision_config with the classes Qwen3_5Config names whatever the dict "
        "says (create_subconfig) and gives them their own model_type, the value",
    ("config-remove", r"^vision_config\.num_heads$"):
        "its default (16) divides the vision width as well; the head count shapes no stored tensor (qkv is "
        "3 x hidden): a valid config",
    ("config-remove", r"^torch_dtype$"):
        "vLLM's dtype 'auto' serves a config without a dtype in the platform's first dtype (bfloat16 where "
        "supported) and transformers upcasts the BF16 tensors exactly: a config without a dtype is valid",
    ("config-remove", r"^mtp_num_hidden_layers$"):
        "read only by vLLM's MTP speculative decoding (speculative.py, Qwen3_5MTP); the served model skips mtp.* "
        "and builds the same layers, transformers ignores it",
    # quantization_config
    ("config-remove", r"^quantization_config\.quantization_status$"):
        "vLLM does not read it and serves the weights as stored: a quant-config-invalid warning (transformers "
        "decompresses only a 'compressed' status), no error",
    ("config-alter", r"^quantization_config\.quantization_status$"):
        "vLLM does not read it and serves the weights as stored: a quant-config-invalid warning (transformers "
        "decompresses only a 'compressed' status), no error",
    ("config-alter", r"\.weights\.dynamic$"):
        "NVFP4 weights made dynamic: vLLM 0.28/0.33 ignore the flag for NVFP4 and serve the stored scales (a "
        "quant-config-invalid warning: compressed-tensors would store none); FP8 weights made dynamic stay an "
        "error, vLLM refuses them (detected, so not a miss)",
    ("config-remove", r"^quantization_config\.version$"):
        "the writer's compressed-tensors version: neither vLLM nor compressed-tensors' loading reads it",
    ("config-alter", r"^quantization_config\.(version|global_compression_ratio)$"):
        "metadata: neither vLLM nor compressed-tensors' loading reads it",
    ("config-remove", r"^quantization_config\.(config_groups\.group_\d+\.)?format$"):
        "every group then carries its own format (hybrid, mixed) or is NVFP4 (nvfp4): vLLM falls back to the "
        "top-level format only for a group without one and selects NVFP4 from the arguments before any format, "
        "and compressed-tensors decompresses a module by its group's format or infers nvfp4-pack-quantized "
        "(infer_module_format)",
    ("config-alter", r"^quantization_config\.format$"):
        "every group carries its own format (mixed-precision): vLLM falls back to the top-level format only for a "
        "group without one, and compressed-tensors decompresses each module by its group's format",
    ("config-remove", r"^quantization_config\.ignore$"):
        "hybrid and mixed: the group targets match none of the ignored modules, so vLLM and compressed-tensors "
        "build the same layers without it (for nvfp4 and fp8, whose target is Linear, it is reported)",
    ("config-remove", r"\.(weights|input_activations)\.(symmetric|num_bits)$"):
        "compressed-tensors' default (symmetric true, num_bits 8) is the value",
    ("config-remove", r"\.weights\.dynamic$"): "compressed-tensors' default (false) is the value",
    ("config-remove", r"\.input_activations\.strategy$"):
        "the FP8 dynamic input then reads as per-tensor (no group_size), a valid scheme vLLM builds as "
        "CompressedTensorsW8A8Fp8 with the same stored tensors (dynamic activations store none)",
    ("config-remove", r"\.input_activations\.type$"):
        "FP8 dynamic: the input then reads as int (the default), which no W8A8 scheme takes, so vLLM builds "
        "CompressedTensorsW8A16Fp8 from the same stored tensors (FP8 weight and its per-channel scale; dynamic "
        "activations store none): it loads every tensor and decodes the same weights",
    ("config-remove", r"\.(observer|observer_kwargs)$"):
        "a calibration setting: loading a compressed checkpoint runs no observer",
    ("config-alter", r"\.(observer|observer_kwargs)$"):
        "a calibration setting: loading a compressed checkpoint runs no observer",
    ("config-remove", r"\.scale_dtype$"):
        "NVFP4: compressed-tensors sizes scales by the observed dtype and its NVFP4 compressor stores FP8 weight "
        "scales whatever scale_dtype says; vLLM reads scale_dtype only to recognise MXFP8",
    ("config-alter", r"\.input_activations\.symmetric$"):
        "FP8 dynamic input made asymmetric: compressed-tensors 0.17 accepts it and vLLM 0.28/0.33 build "
        "CompressedTensorsW8A8Fp8 (_is_fp8_w8a8 accepts any dynamic input before it reads symmetric); dynamic "
        "activations store no tensor",
    # config.json values any of which is a valid config: they change numerics or limits, no tensor, no refusal
    ("config-alter", r"^text_config\.(rms_norm_eps|max_position_embeddings|rope_parameters\.rope_theta)$"):
        "any positive value is a valid config: it changes numerics (or the context limit), no tensor, and "
        "nothing vLLM or transformers refuses",
    ("config-alter", r"^mtp_num_hidden_layers$"):
        "read only by vLLM's MTP speculative decoding (speculative.py, Qwen3_5MTP); the served model skips mtp.* "
        "and builds the same layers, transformers ignores it",
    ("config-alter", r"^vision_config\.model_type$"):
        "transformers builds vision_config with Qwen3_5VisionConfig whatever model_type says (create_subconfig), "
        "and neither its vision tower nor vLLM's reads it",
    # a tensor added to the int8 tables file is matched as "<file>:<name>" (see run_checkpoint)
    ("add", r"^clef_head/tables_int8\.safetensors:"):
        "a tensor beside the tables in clef_head/tables_int8.safetensors: the plugin reads the tables and their "
        "scales by name (load_int8_tables) and vLLM never globs clef_head/, so it is never loaded: a "
        "table-shape warning, served bit for bit (engine tier, issue 23)",
    ("config-alter", r"_token_id$"):
        "another id below vocab_size that no other special token has: a valid config; which token it is, is the "
        "tokenizer's to say (verify does not read tokenizer ids)",
}


def _indistinguishable(cls: str, target: str) -> str | None:
    """The listed reason for a miss (``gap: ...`` for a known gap), or None."""
    for (c, pattern), reason in INDISTINGUISHABLE.items():
        if c == cls and re.search(pattern, target):
            return reason
    for (c, pattern), reason in KNOWN_GAPS.items():
        if c == cls and re.search(pattern, target):
            return "gap: " + reason
    return None


#: Mutations verify does not catch although they are detectable in principle: gaps, each with why.
#: They count as misses in the rates; the suite fails on any miss in neither list. Empty: every
#: detectable mutation of the generated classes is detected.
KNOWN_GAPS: dict[tuple[str, str], str] = {}


class Mutation:
    def __init__(self, cls: str, target: str, apply: Callable[[Path], None], rel: str) -> None:
        self.cls, self.target, self.apply, self.rel = cls, target, apply, rel


def _role(name: str, sig: Any) -> tuple[str, Any]:
    return re.sub(r"\.\d+(?=\.|$)", ".N", name), sig


def _tensor_mutations(root: Path) -> Iterator[Mutation]:
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.safetensors"))
    seen_roles: set[Any] = set()
    modules: dict[str, tuple[str, set[str], tuple[int, ...]]] = {}
    for rel in files:
        ents, _ = entries(root / rel)
        for name, (dtype, shape) in sorted(ents.items()):
            module, _, suffix = name.rpartition(".")
            if module:
                modules.setdefault(module, (rel, set(), shape))[1].add(suffix)
            role = _role(name, (dtype, shape))
            if role in seen_roles:
                continue
            seen_roles.add(role)

            def edit(fn: Callable[[dict], None], rel: str = rel) -> Callable[[Path], None]:
                return lambda r: edit_file(r, rel, fn)

            yield Mutation("delete", name, edit(lambda e, n=name: e.pop(n)), rel)
            width = BITS[dtype]
            same = WIDTHS[width][(WIDTHS[width].index(dtype) + 1) % len(WIDTHS[width])]
            yield Mutation("dtype-same", name, edit(lambda e, n=name, d=same: e.update({n: (d, e[n][1])})), rel)
            yield Mutation("dtype-other", name, edit(lambda e, n=name, d=OTHER[width]: e.update({n: (d, e[n][1])})), rel)
            new_shape = (*shape[:-1], shape[-1] + 1) if shape else (1,)
            yield Mutation("shape", name, edit(lambda e, n=name, s=new_shape: e.update({n: (e[n][0], s)})), rel)
    seen_modules: set[Any] = set()
    for module, (rel, suffixes, shape) in sorted(modules.items()):
        role = _role(module, tuple(sorted(suffixes)))
        if role in seen_modules:
            continue
        seen_modules.add(role)
        extra = f"{module}.bias" if "bias" not in suffixes else f"{module}.weight_zero_point"
        rows = shape[0] if shape else 1
        yield Mutation("add", extra,
                       lambda r, rel=rel, x=extra, n=rows: edit_file(r, rel, lambda e: e.update({x: ("BF16", (n,))})), rel)
    for rel in files:
        if rel.startswith(L.HEAD_DIR) or rel == L.RELEASE_HEAD_WEIGHTS:
            name = "extra_projection.weight"
            yield Mutation("add", name,
                           lambda r, rel=rel, n=name: edit_file(r, rel, lambda e: e.update({n: ("BF16", (4, 4))})), rel)


def _leaves(obj: Any, prefix: str = "") -> Iterator[tuple[str, list[str], Any]]:
    for k, v in obj.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            yield from _leaves(v, path + ".")
        else:
            yield path, [*prefix.split(".")[:-1], k] if prefix else [k], v


def _altered(v: Any) -> Any:
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + 1
    if isinstance(v, float):
        return v * 2 + 1
    if isinstance(v, str):
        return v + "-x"
    if isinstance(v, list) and len(v) == 1 and isinstance(v[0], str):
        return [v[0] + "-x"]  # architectures, a group's targets: another name (shortening would empty them)
    if isinstance(v, list) and v:
        return v[:-1]
    return None


def _config_mutations(root: Path) -> Iterator[Mutation]:
    import json

    for rel in (L.CONFIG, L.HEAD_CONFIG, L.RELEASE_HEAD_CONFIG):
        if not (root / rel).exists():
            continue
        obj = json.loads((root / rel).read_text())
        seen: set[str] = set()
        for path, keys, value in _leaves(obj):
            role = re.sub(r"group_\d+", "group_N", path)
            if role in seen:
                continue
            seen.add(role)

            def at(o: dict, keys: list[str] = keys) -> dict:
                for k in keys[:-1]:
                    o = o[k]
                return o

            yield Mutation("config-remove", path, lambda r, rel=rel, at=at, k=keys[-1]: edit_json(r, rel, lambda o: at(o).pop(k)),
                           rel)
            new = _altered(value)
            if new is not None:
                yield Mutation("config-alter", path,
                               lambda r, rel=rel, at=at, k=keys[-1], n=new: edit_json(r, rel, lambda o: at(o).__setitem__(k, n)),
                               rel)


def _named(report: Any, m: Mutation, baseline: set[Any]) -> bool:
    """An error the valid checkpoint did not have, naming the tensor, its module or the key; for a float
    tensor given another float dtype, the ``dtype-cast`` warning naming it (vLLM and transformers cast it
    on load: served, so reported but not refused)."""
    leaf = m.target.rsplit(".", 1)[-1]
    module = m.target.rpartition(".")[0]
    for f in report.findings:
        cast = f.code == "dtype-cast" and m.cls.startswith("dtype")
        if (f.severity != "error" and not cast) or (f.code, f.tensor, f.module) in baseline:
            continue
        names = {f.tensor, f.module}
        if m.cls.startswith("config"):
            if leaf in f.message or f.tensor or f.module or f.file:
                return True
        elif m.target in names or m.target in f.message or (module and (module in names or
                                                            any(n and n.startswith(m.target) for n in names))):
            return True
        elif any(n and m.target.startswith(n + ".") for n in names):  # a whole layer / stack named
            return True
    return False


CHECKPOINTS = [(b, lay, s) for b in BUILDS for lay in ("layout-1", "layout-2", "layout-2-unmarked") for s in (1, 2)]
CHECKPOINTS += [("bf16", "original-release", 1), ("bf16", "original-release", 4)]


#: The checkpoints mutated in full; every other one is sampled (one role in SAMPLE, by a hash of
#: the target), so every build x layout x sharding is covered and the suite stays within minutes.
PRIMARY = {(b, "layout-2", 1) for b in BUILDS} | {("bf16", "original-release", 4), ("hybrid", "layout-1", 2)}
SAMPLE = 4


def run_checkpoint(tmp: Path, build: str, layout: str, shards: int) -> dict[str, list[Any]]:
    """Every mutation of one checkpoint -> class -> [(target, detected, reason-if-listed)]."""
    import zlib

    sample = 1 if (build, layout, shards) in PRIMARY else SAMPLE
    root = build_checkpoint(tmp / f"{build}-{layout}-{shards}", layout=layout, build=build, num_layers=4, shards=shards)
    sparsify(root)
    base = verify_checkpoint(read_checkpoint(root), str(root))
    baseline = {(f.code, f.tensor, f.module) for f in base.findings if f.severity == "error"}
    assert {c for c, _, _ in baseline} <= ({"marker-missing"} if layout == "layout-2-unmarked" else set()), base.findings
    snap = Snapshot(root)
    out: dict[str, list[Any]] = {}
    for m in [*_tensor_mutations(root), *_config_mutations(root)]:
        if zlib.crc32(f"{m.cls} {m.target}".encode()) % sample:
            continue
        m.apply(root)
        report = verify_checkpoint(read_checkpoint(root), str(root))
        listed = f"{m.rel}:{m.target}" if m.rel == L.TABLES else m.target
        out.setdefault(m.cls, []).append((m.target, _named(report, m, baseline), _indistinguishable(m.cls, listed)))
        snap.restore([m.rel])
    return out


def summarize(results: dict[str, list[Any]]) -> tuple[str, list[str]]:
    lines, unexplained = [], []
    for cls in sorted(results):
        rows = results[cls]
        hit = sum(1 for _, d, _ in rows if d)
        gaps = sum(1 for _, d, r in rows if not d and r and r.startswith("gap: "))
        listed = sum(1 for _, d, r in rows if not d and r) - gaps
        lines.append(f"{cls:14s} {hit:5d}/{len(rows):<5d} detected ({100 * hit / len(rows):5.1f}%), "
                     f"{listed} indistinguishable (listed), {gaps} known gaps (listed)")
        unexplained += [f"{cls} {t}" for t, d, r in rows if not d and not r]
    return "\n".join(lines), unexplained


@pytest.mark.parametrize("build, layout, shards", CHECKPOINTS, ids=[f"{b}-{lay}-{s}" for b, lay, s in CHECKPOINTS])
def test_every_mutation_is_reported(tmp_path, build, layout, shards):
    t0 = time.perf_counter()
    results = run_checkpoint(tmp_path, build, layout, shards)
    table, unexplained = summarize(results)
    print(f"\n{build} {layout} shards={shards} ({time.perf_counter() - t0:.1f}s)\n{table}", file=sys.stderr)
    assert not unexplained, f"undetected mutations not listed as indistinguishable:\n{table}\n" + "\n".join(unexplained)


if __name__ == "__main__":  # python -m tests.scenarios.test_mutations: the whole table, with timings
    import tempfile

    total: dict[str, list[Any]] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        for b, lay, s in CHECKPOINTS:
            for cls, rows in run_checkpoint(Path(d), b, lay, s).items():
                total.setdefault(cls, []).extend(rows)
    table, unexplained = summarize(total)
    print(table)
    used = {(c, p) for (c, p) in {**INDISTINGUISHABLE, **KNOWN_GAPS}
            for cls, rows in total.items() if cls == c for t, d, _ in rows if not d and re.search(p, t)}
    for entry in sorted(set(INDISTINGUISHABLE) | set(KNOWN_GAPS)):
        if entry not in used:
            print(f"listed but no miss used it: {entry}")
    print(f"{sum(len(r) for r in total.values())} mutations in {time.perf_counter() - t0:.0f}s")
    print("\n".join(sorted(set(unexplained))) or "every miss is listed")
