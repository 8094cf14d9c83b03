"""Findings: the one place that defines every finding code and what a report looks like.

Codes are a contract (README.md's codes table): stable kebab-case strings that scripts match on.
Add new codes at the end of ``CODES``; never rename or remove one.
"""

from __future__ import annotations

from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Literal

    Severity = Literal["error", "warning", "info"]
else:
    Severity = str

#: Every finding code, with the one-line meaning shown by ``clef-format codes``.
CODES: dict[str, str] = {
    # files and headers
    "missing-file": "a file the layout requires is absent (or not a regular file); as a warning: a tokenizer file missing or empty",
    "bad-header": "a safetensors header is invalid or the file is truncated",
    "path-escape": "an index entry or symlink leads outside the checkpoint",
    "unsafe-file": "pickle-based weights are present; they are never loaded",
    "bad-config": "a JSON file (config, index, head config, manifest; the tokenizer files in --deep and the gate) is missing keys, has wrong types, holds a key twice with different values (the tokenizer files: a warning, their loaders take the last value) or is not JSON; as a warning: a key twice with the same value",
    "index-mismatch": "model.safetensors.index.json disagrees with the shard headers, or names a shard by a string vLLM does not match (anything but a plain top-level file name: ./x, sub/x, sub/../x); as a warning: an entry missing or naming another indexed file for a tensor vLLM loads anyway",
    "partial-download": "an unfinished download (.incomplete) is present",
    "stray-weights": "a top-level, non-hidden .safetensors file is not part of the backbone: a plain vLLM load would read it too",
    # layouts and the version marker
    "legacy-layout": "layout-1: BF16 tables inside the backbone, needs plugin < 0.2.0",
    "marker-missing": "int8 tables present but no requires_clef_vllm marker (the 2026-10-07 state)",
    "marker-invalid": "requires_clef_vllm is not a PEP 440 specifier, or admits a version below 0.2.0, or none",
    "plugin-incompatible": "the plugin version given (--plugin-version) or installed in the environment checked cannot serve these weights",
    "unknown-layout": "the files match no known Clef layout",
    # tables
    "tables-missing": "embed_tokens / lm_head are neither in the backbone nor in the int8 tables file",
    "tables-duplicated": "the tables are both in the backbone and in the int8 tables file",
    "table-shape": "a table's name, dtype or shape disagrees with the config or the format; as a warning: a tensor the format does not define beside the tables (ignored by the plugin)",
    "nonfinite-scale": "a scale (a table row's, or a backbone scale: NVFP4 global, FP8, KV cache) is NaN or infinite (a negative table row scale too)",
    "tables-metadata": "the int8 tables file's metadata says another format; as a warning: provenance metadata (quality, source_dtype, digests, ...) missing or unreadable",
    # joint head
    "head-incomplete": "the joint head lacks tensors or its config lacks keys",
    "head-unexpected": "the joint head has tensors or config keys its config does not imply",
    # backbone tensors
    "tensor-missing": "a tensor the config implies is absent",
    "tensor-unexpected": "a tensor the config does not imply is present",
    "tensor-shape": "a tensor's dtype or shape disagrees with the config",
    # quantization patterns against vLLM
    "pattern-unmatched": "a quantization target matches no vLLM layer",
    "ignore-unmatched": "an ignore entry matches no vLLM layer",
    "pattern-hf-anchored": "a pattern matches Hugging Face names but not vLLM's",
    "fused-scheme-mismatch": "shards of one fused vLLM layer resolve to different schemes",
    "scheme-tensor-mismatch": "vLLM will build a layer whose scheme differs from the stored tensors",
    "layer-unquantized": "a layer stored or meant quantized resolves to BF16 in vLLM",
    "quant-config-invalid": "quantization_config is not a valid compressed-tensors config, vLLM cannot build a layer from it, or it contradicts the stored tensors where vLLM refuses them; as a warning: a contradiction vLLM serves anyway and transformers does not load (NVFP4 dynamic weights, a status other than compressed)",
    # deep verification
    "hash-mismatch": "a file's content does not match its expected hash",
    "manifest-missing": "deep verification found nothing to compare a file against",
    "scale-range": "a decoded scale is outside the range its dtype allows",
    "deep-verified": "verify --deep hashed files against their references and every hash matched (info)",
    # migrate
    "migrate-refused": "migrate would not start (or go on); the checkpoint is unchanged",
    "migrate-failed": "migrate failed while writing and rolled back; the checkpoint is unchanged",
    "table-nonfinite": "a source table row holds NaN or Inf; it cannot be quantized faithfully",
    "migrate-recovered": "migrate found an interrupted run and resumed, finished or rolled it back (info)",
    "manifest-refused": "manifest would not write: a cache snapshot, a checkpoint with errors, files that fail their download metadata, or files that differ from the present manifest with no download metadata to tell which bytes are right (see --force)",
    # the command could not run (exit 2): nothing was said about the checkpoint's content
    "usage-error": "the command line is not a valid command (exit 2)",
    "path-not-found": "PATH is neither a directory nor a repo id in the local Hugging Face cache (exit 2)",
    "unreadable": "a file or directory could not be read or listed (permissions, I/O error, or a file that changed size while it was read: one finding per file); exit 2",
    "unwritable": "a file or directory could not be written (permissions, read-only disk); exit 2",
    "interrupted": "the command was interrupted (SIGINT); exit 2",
    # added later (kept at the end: codes are never reordered or renamed)
    "table-value-range": "an int8 table holds -128, outside the format's [-127, 127] (a corrupted file)",
    "workdir-replaced": "migrate replaced the folder the shell was in: cd into it again to see the new files",
    "config-invalid": "a config.json value vLLM or transformers refuses, or that makes them build a model these weights do not fit (a JSON type transformers' strict config classes refuse, architectures, model_type, activations, RoPE, vision heads, special token ids, tied tables; a NaN, infinite or out-of-range rms_norm_eps, rope_theta or max_position_embeddings; an mrope_section whose sum is not rotary_dim / 2)",
    "head-config-invalid": "the joint head config contradicts itself or its tensors (heads must divide width; the feedforward width)",
    "vllm-unproven": "the pattern rules for the --vllm-version asked about are extrapolated from the version table, not proven against that vLLM (info)",
    "copy-broken": "scan: a copy found on this machine that verify calls BROKEN (its row holds the full report)",
    "copy-unreadable": "scan: a copy (or a folder that may hold one) could not be read or listed; the scan went on",
    "scan-limit": "scan stopped descending (depth or entry cap): copies further down were not looked for",
    "global-scale-mismatch": "shards vLLM fuses into one layer (in_proj_qkv/in_proj_z, q/k/v, gate/up) store different NVFP4 global scales: vLLM keeps the largest, and the other shards decode scaled down, with reduced accuracy (vLLM's own log)",
    "head-code-invalid": "joint_schema_model.py is not valid Python (the plugin fails to import it at start); as info: it could not be read statically (over the size limit, nested too deeply, no JointSchemaHead class) and the head is checked from the known facts",
    "head-names-inferred": "a head tensor differs from the names clef-format infers for the joint head; only a note (info): the checkpoint's own joint_schema_model.py and the known facts decide",
    "dtype-cast": "float tensors are stored in another float dtype than config.json's torch_dtype (or the scheme's): vLLM and transformers cast them on load (warning)",
    "pattern-class-name": "a quantization target matches vLLM layers only by their class name, which compressed-tensors' quantizer matches differently (warning)",
    "table-zero-scale": "an int8 table row has scale 0 but values not all 0: it would be served as zeros (the format gives scale 0 to a zero row alone)",
    "digest-mismatch": "a tensor's bytes differ from the digest its file's metadata records (a table edited, swapped or replaced by one of the same shape)",
    "bundled-plugin-mismatch": "the plugin the folder ships in vllm_plugin/ cannot serve its weights: weights and plugin come from different revisions",
    "bundled-plugin-unread": "the version of the plugin in vllm_plugin/ cannot be read without running its build (warning)",
    "example-refused": "example would not build there: the folder lies inside a Hugging Face cache, or a migrate holds its lock",
    "installed-plugin-unread": "the installed clef-vllm's metadata gives no valid version (empty or not PEP 440): whether it can serve these weights is not known (warning)",
    "tree-too-deep": "folders nest deeper inside the checkpoint than the reader descends (a hostile or broken tree): what lies below was not read",
    "special-file": "a FIFO, socket or device where a file belongs: never opened (an engine opening it would block forever or read something that is not the file)",
}

#: Codes that mean the command could not run: the CLI exits 2 when a report holds one of them.
COULD_NOT_RUN: frozenset[str] = frozenset({"usage-error", "path-not-found", "unreadable", "unwritable", "interrupted"})


class _FindingFields(Record):
    code: str
    severity: Severity
    message: str
    file: str | None = None
    tensor: str | None = None
    module: str | None = None
    fix: str | None = None


class Finding(_FindingFields):
    """One thing verify noticed: a stable code, how bad it is, and how to fix it."""

    __slots__ = ()

    def __new__(cls, code: str, severity: Severity, message: str, file: str | None = None,
                tensor: str | None = None, module: str | None = None, fix: str | None = None) -> "Finding":
        if code not in CODES:
            raise ValueError(f"unknown finding code {code!r}: add it to clef_format.spec.findings.CODES")
        if severity not in ("error", "warning", "info"):
            raise ValueError(f"unknown severity {severity!r}")
        return super().__new__(cls, code, severity, message, file, tensor, module, fix)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "severity": self.severity, "message": self.message}
        for key in ("file", "tensor", "module", "fix"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


def error(code: str, message: str, **where: str | None) -> Finding:
    return Finding(code, "error", message, **where)


def warning(code: str, message: str, **where: str | None) -> Finding:
    return Finding(code, "warning", message, **where)


def info(code: str, message: str, **where: str | None) -> Finding:
    return Finding(code, "info", message, **where)
