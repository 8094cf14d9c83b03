"""The int8 tables file ``clef_head/tables_int8.safetensors``: the one definition of its format.

Per table (``embed_tokens`` and ``lm_head``, under their Hugging Face names):

* ``<name>``        I8  ``[vocab, hidden]``  the quantized rows
* ``<name>_scale``  F32 ``[vocab, 1]``       one scale per row

Symmetric absmax per row: ``scale = max|row| / 127``, ``q = round(row / scale)`` clamped to
``[-127, 127]`` (round half to even), and a row decodes as ``q * scale`` (in float32, then cast
to the serving dtype). An all-zero row has scale 0 and decodes to zeros. Scales are finite and
non-negative. ``__metadata__`` carries the keys in ``REQUIRED_METADATA`` (see ``metadata_for``).

This module reads no tensor data and imports no torch: verify uses it on headers alone,
``quantize`` implements the arithmetic, migrate writes it, the vLLM hooks read it.
"""

from __future__ import annotations

import json

from clef_format.spec.layouts import Layout

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Mapping

FORMAT_VERSION = "1"
QUANT_METHOD = "int8-symmetric-absmax-per-row"
SCALE_SUFFIX = "_scale"
QMAX = 127
VALUE_DTYPE = "I8"
SCALE_DTYPE = "F32"

#: Metadata keys the file must carry, and the value each must have where it is fixed.
REQUIRED_METADATA: dict[str, str | None] = {
    "format": "pt",
    "clef_tables_format": FORMAT_VERSION,
    "clef_layout": Layout.LAYOUT_2.value,
    "quantization": QUANT_METHOD,
    "source_dtype": None,  # dtype of the tables it was made from, e.g. "BF16"
    "quality": None,  # JSON: {table: {rel_error, mean_row_cosine, min_row_cosine, max_row_rel_error}}
}


def scale_name(table: str) -> str:
    return table + SCALE_SUFFIX


def expected_entries(tables: tuple[str, ...], vocab: int, hidden: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor the file must hold: name -> (dtype, shape)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name in tables:
        out[name] = (VALUE_DTYPE, (vocab, hidden))
        out[scale_name(name)] = (SCALE_DTYPE, (vocab, 1))
    return out


def metadata_for(source_dtype: str, quality: Mapping[str, Mapping[str, float]]) -> dict[str, str]:
    """The ``__metadata__`` a writer puts in the file."""
    return {
        "format": "pt",
        "clef_tables_format": FORMAT_VERSION,
        "clef_layout": Layout.LAYOUT_2.value,
        "quantization": QUANT_METHOD,
        "source_dtype": source_dtype,
        "quality": json.dumps({k: dict(v) for k, v in quality.items()}, sort_keys=True),
    }


def metadata_problems(metadata: Mapping[str, str]) -> list[str]:
    """What is wrong with a tables file's metadata; empty when it matches the format."""
    problems = []
    for key, fixed in REQUIRED_METADATA.items():
        if key not in metadata:
            problems.append(f"metadata lacks {key!r}")
        elif fixed is not None and metadata[key] != fixed:
            problems.append(f"metadata {key}={metadata[key]!r}, expected {fixed!r}")
    if "quality" in metadata:
        try:
            quality: Any = json.loads(metadata["quality"])
            if not isinstance(quality, dict):
                raise ValueError
        except ValueError:
            problems.append("metadata 'quality' is not a JSON object")
    return problems
