"""The int8 tables file ``clef_head/tables_int8.safetensors``: the one definition of its format.

Per table (``embed_tokens`` and ``lm_head``, under their Hugging Face names):

* ``<name>``        I8  ``[vocab, hidden]``  the quantized rows
* ``<name>_scale``  F32 ``[vocab, 1]``       one scale per row

Symmetric absmax per row: ``scale = max|row| / 127``, ``q = round(row / scale)`` clamped to
``[-127, 127]`` (round half to even), and a row decodes as ``q * scale`` (in float32, then cast
to the serving dtype). An all-zero row has scale 0 and decodes to zeros. ``__metadata__`` carries
the keys in ``REQUIRED_METADATA`` (see ``metadata_for``).

**What a valid table is** (the one definition; verify, ``verify --deep``, the marker repair and
migrate all apply these functions, never their own):

* an int8 table: every row scale finite and >= 0, and small enough that ``127 * scale`` is a
  finite BF16 (``scale <= SCALE_MAX``); a scale of 0 (or -0) only on a row whose values are all 0
  (the quantizer gives scale 0 to a zero row alone: a zero scale on any other row erases it);
  every value in ``[-127, 127]`` (``-128`` is never written: it is the mark of a corrupted or
  foreign file). ``TableRule`` applies all of it to one table streamed in row blocks;
* a BF16 (or F16/F32) table, the source of a migration or the layout-1 tables: every value finite.

The scale rule runs on the raw F32 bits (a 248320-row scale costs about a millisecond without
numpy), so verify's fast path applies it; the value rules read the whole table and run in
``verify --deep``, in the serving gate at start-up, before a repair and before a migration reads
or decodes the tables, and on the file migrate writes (``read.table_scan`` streams it).

**Digests** (optional when reading: a tables file not written by clef-format may lack them):
``__metadata__["digests"]`` is a JSON object ``{tensor name: "blake3:<hex>"}``, the BLAKE3 of each
tensor's raw bytes. Migrate records it for every tensor it writes, so a table edited, swapped
with the other one or replaced by another of the same shape is seen without any download
reference. Every other metadata key but ``format`` is provenance (the names and metadata of the
release's own tables file are not published): a missing key is a note, never an error.

This module reads no tensor data and imports no torch: verify uses it on headers alone,
``quantize`` implements the arithmetic, migrate writes it, the vLLM hooks read it.
"""

from __future__ import annotations

import json

from clef_format.spec.layouts import Layout

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Collection, Mapping

FORMAT_VERSION = "1"
QUANT_METHOD = "int8-symmetric-absmax-per-row"
SCALE_SUFFIX = "_scale"
QMAX = 127
VALUE_DTYPE = "I8"
SCALE_DTYPE = "F32"

#: Largest finite BF16 (the serving dtype): a decoded row value ``127 * scale`` must not exceed it.
BF16_MAX = 3.3895313892515355e38
#: The largest valid row scale, as F32 bits: the largest F32 ``s`` whose decode is finite. Decoding
#: computes ``127 * s`` in F32 and rounds it to BF16 to nearest, ties to even (torch, the gather
#: kernel). BF16 overflows from the midpoint ``2**128 - 2**119`` up (the tie goes to the even
#: infinity), and the F32 product reaches that midpoint once ``127 * s >= 2**128 - 2**119 - 2**103``
#: (half an F32 ulp below it, the tie again to even). tests/spec/test_table_rule.py derives it from
#: this rule and checks it against torch's decode on both sides.
_SCALE_MAX_BITS = 0x7C00C182
#: That scale as a number (about 2.674e36; ``BF16_MAX / 127`` is a little below it: a decode may round down to BF16_MAX).
SCALE_MAX = 2.674155210428358e36
_SCALE_SAFE_HIGH = bytes(range(_SCALE_MAX_BITS >> 24))  # high bytes that are certainly a valid scale

#: The table dtypes a tables file may be made from (and a downgrade may restore).
SOURCE_DTYPES = ("BF16", "F16", "F32")
#: The figures ``quality`` records per table (``quant.int8.QualityMeter.figures``), each a finite number.
QUALITY_FIGURES = ("rel_error", "mean_row_cosine", "min_row_cosine", "max_row_rel_error")

#: Metadata keys the file must carry, and the value each must have where it is fixed.
REQUIRED_METADATA: dict[str, str | None] = {
    "format": "pt",
    "clef_tables_format": FORMAT_VERSION,
    "clef_layout": Layout.LAYOUT_2.value,
    "quantization": QUANT_METHOD,
    "source_dtype": None,  # dtype of the tables it was made from, e.g. "BF16"
    "quality": None,  # JSON: {table: {rel_error, mean_row_cosine, min_row_cosine, max_row_rel_error}}
}
#: Keys that tag the file for a framework (safetensors' ``format``), not for this format: a value other
#: than the writer's changes no byte any loader reads, so it is a note, never a problem.
FRAMEWORK_TAGS = ("format",)
#: The optional metadata key holding per-tensor content digests (JSON: {name: "blake3:<hex>"}).
DIGESTS_KEY = "digests"
DIGEST_ALGORITHM = "blake3"


def scale_name(table: str) -> str:
    return table + SCALE_SUFFIX


def expected_entries(tables: tuple[str, ...], vocab: int, hidden: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor the file must hold: name -> (dtype, shape)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name in tables:
        out[name] = (VALUE_DTYPE, (vocab, hidden))
        out[scale_name(name)] = (SCALE_DTYPE, (vocab, 1))
    return out


def metadata_for(source_dtype: str, quality: Mapping[str, Mapping[str, float]],
                 digests: Mapping[str, str] | None = None) -> dict[str, str]:
    """The ``__metadata__`` a writer puts in the file (``digests``: name -> ``"blake3:<hex>"``)."""
    out = {
        "format": "pt",
        "clef_tables_format": FORMAT_VERSION,
        "clef_layout": Layout.LAYOUT_2.value,
        "quantization": QUANT_METHOD,
        "source_dtype": source_dtype,
        "quality": json.dumps({k: dict(v) for k, v in quality.items()}, sort_keys=True),
    }
    if digests is not None:
        out[DIGESTS_KEY] = digests_text(digests)
    return out


def digests_text(digests: Mapping[str, str]) -> str:
    """The ``digests`` metadata value: compact, sorted JSON."""
    return json.dumps(dict(digests), sort_keys=True, separators=(",", ":"))


def read_digests(metadata: Mapping[str, str]) -> tuple[dict[str, str], str | None]:
    """The recorded digests (name -> hex of ``DIGEST_ALGORITHM``) and what is wrong with the entry, if
    anything. Absent: ``({}, None)``; malformed entries are left out and named in the problem."""
    text = metadata.get(DIGESTS_KEY)
    if text is None:
        return {}, None
    try:
        obj: Any = json.loads(text)
    except ValueError:
        return {}, f"metadata {DIGESTS_KEY!r} is not JSON"
    if not isinstance(obj, dict):
        return {}, f"metadata {DIGESTS_KEY!r} is not a JSON object"
    out, bad = {}, []
    prefix = DIGEST_ALGORITHM + ":"
    for name, value in obj.items():  # case-insensitive, as hex digests are: "BLAKE3:" and upper-case hex read alike
        low = value.lower() if isinstance(value, str) else ""
        hexpart = low[len(prefix):] if low.startswith(prefix) else ""
        if len(hexpart) == 64 and not hexpart.strip("0123456789abcdef"):
            out[name] = hexpart
        else:
            bad.append(name)
    problem = (f"metadata {DIGESTS_KEY!r}: entries {sorted(bad)[:5]} are not \"{prefix}<64 hex digits>\""
               if bad else None)
    return out, problem


def metadata_problems(metadata: Mapping[str, str], tables: tuple[str, ...] | None = None) -> list[str]:
    """What contradicts the format in a tables file's metadata: a key whose fixed value differs (the
    file says it is something else). Empty when it matches. Missing keys are ``metadata_notes``."""
    problems = []
    for key, fixed in REQUIRED_METADATA.items():
        if key in metadata and fixed is not None and metadata[key] != fixed and key not in FRAMEWORK_TAGS:
            problems.append(f"metadata {key}={metadata[key]!r}, expected {fixed!r}")
    return problems


def metadata_notes(metadata: Mapping[str, str], tables: tuple[str, ...] | None = None,
                   tensors: Collection[str] | None = None) -> list[str]:
    """Provenance the file lacks or garbles (a missing key, ``quality``, ``source_dtype``, ``digests``,
    a digest of a tensor the file does not hold: ``tensors``, the file's names): no loader reads it,
    and the release's own tables file may not carry it, so these are notes."""
    notes = [f"metadata lacks {key!r}" for key in REQUIRED_METADATA if key not in metadata]
    notes += [f"metadata {key}={metadata[key]!r}, expected {REQUIRED_METADATA[key]!r} (safetensors' framework tag, "
              "not the tables' format: the rows read the same)"
              for key in FRAMEWORK_TAGS if key in metadata and metadata[key] != REQUIRED_METADATA[key]]
    if "source_dtype" in metadata and metadata["source_dtype"] not in SOURCE_DTYPES:
        notes.append(f"metadata source_dtype={metadata['source_dtype']!r}, expected one of {', '.join(SOURCE_DTYPES)}")
    if "quality" in metadata:
        notes += _quality_problems(metadata["quality"], tables)
    recorded, problem = read_digests(metadata)
    if problem:
        notes.append(problem)
    stray = sorted(set(recorded) - set(tensors)) if tensors is not None else []
    if stray:
        notes.append(f"metadata {DIGESTS_KEY!r} records {len(stray)} tensor(s) the file does not hold "
                     f"({', '.join(stray[:5])}): a tensor renamed or dropped after the digests were written")
    return notes


def _quality_problems(text: str, tables: tuple[str, ...] | None) -> list[str]:
    """``quality`` is a JSON object: per table, an object with each of QUALITY_FIGURES a finite number."""
    try:
        quality: Any = json.loads(text)
    except ValueError:
        return ["metadata 'quality' is not JSON"]
    if not isinstance(quality, dict):
        return ["metadata 'quality' is not a JSON object"]
    out = []
    if tables is not None and set(quality) != set(tables):
        out.append(f"metadata 'quality' describes {sorted(quality)}, expected the tables {sorted(tables)}")
    for name, figures in sorted(quality.items()):
        if not isinstance(figures, dict):
            out.append(f"metadata 'quality' of {name!r} is not an object")
            continue
        bad = [k for k in QUALITY_FIGURES if type(figures.get(k)) not in (int, float) or figures[k] - figures[k] != 0]
        # (x - x is 0 for every finite number, NaN for NaN and the infinities; math costs an import here)
        if bad:
            out.append(f"metadata 'quality' of {name!r} lacks finite {', '.join(bad)}")
    return out


class Problems:
    """Counts and first indexes of bad elements, by kind (``nonfinite``, ``negative``, ``too-large``,
    ``out-of-range``, ``zero-scale``); empty when the data follows the rule."""

    LIMIT = 5

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, list[int]] = {}

    def add(self, kind: str, index: int) -> None:
        self.counts[kind] = self.counts.get(kind, 0) + 1
        first = self.first.setdefault(kind, [])
        if len(first) < self.LIMIT:
            first.append(index)

    def merge(self, other: "Problems", offset: int = 0) -> None:
        for kind, count in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + count
            first = self.first.setdefault(kind, [])
            first += [offset + i for i in other.first[kind]][: self.LIMIT - len(first)]

    def __bool__(self) -> bool:
        return bool(self.counts)

    def describe(self) -> str:
        words = {"nonfinite": "NaN or infinite", "negative": "negative", "too-large": f"above {SCALE_MAX:.4g} "
                 f"(times {QMAX} they overflow BF16)", "out-of-range": f"outside [-{QMAX}, {QMAX}] (-128)",
                 "zero-scale": "scale 0 on a row whose values are not all 0"}
        return "; ".join(f"{n} {words[k]} (at {self.first[k]})" for k, n in sorted(self.counts.items()))


def scale_problems(data: bytes) -> Problems:
    """Apply the row-scale rule to little-endian F32 bytes: finite, not negative (-0 is zero), at most
    ``SCALE_MAX``. Judged on the sign and exponent bits: only suspicious values are looked at one by one."""
    out = Problems()
    high = data[3::4]
    if not high.translate(None, _SCALE_SAFE_HIGH):
        return out
    for i in range(len(data) // 4):
        if high[i] < len(_SCALE_SAFE_HIGH):
            continue
        bits = int.from_bytes(data[4 * i: 4 * i + 4], "little")
        if bits == 0x80000000:
            continue  # -0.0 decodes to a zero row
        if bits & 0x7F800000 == 0x7F800000:
            out.add("nonfinite", i)
        elif bits & 0x80000000:
            out.add("negative", i)
        elif bits > _SCALE_MAX_BITS:
            out.add("too-large", i)
    return out


def int8_problems(data: bytes) -> Problems:
    """Apply the value rule to int8 bytes: every value in [-127, 127], i.e. no -128 (0x80)."""
    out = Problems()
    count = data.count(b"\x80")
    if count:
        at = -1
        for _ in range(min(count, Problems.LIMIT)):
            at = data.index(b"\x80", at + 1)
            out.first.setdefault("out-of-range", []).append(at)
        out.counts["out-of-range"] = count
    return out


#: Per float dtype: (bytes per element, offset of the byte holding the exponent's top bits,
#: mask of those bits, the second byte's offset and mask; exponent all ones means NaN or Inf).
_EXPONENT = {"BF16": (2, 1, 0x7F, 0, 0x80), "F16": (2, 1, 0x7C, None, 0), "F32": (4, 3, 0x7F, 2, 0x80)}
_NOT_MAYBE = {d: bytes(b for b in range(256) if b & m != m) for d, (_, _, m, _, _) in _EXPONENT.items()}
FLOAT_TABLE_DTYPES = tuple(_EXPONENT)


def float_problems(dtype: str, data: bytes) -> Problems:
    """Apply the BF16 (F16/F32) table rule: every element finite. Returns element indexes."""
    width, hi, mask, lo, lo_mask = _EXPONENT[dtype]
    out = Problems()
    high = data[hi::width]
    if not high.translate(None, _NOT_MAYBE[dtype]):
        return out
    for i, b in enumerate(high):
        if b & mask == mask and (lo is None or data[width * i + lo] & lo_mask == lo_mask):
            out.add("nonfinite", i)
    return out


def zero_scale_rows(data: bytes) -> list[int]:
    """Rows whose little-endian F32 scale is +0 or -0 (ascending). Judged on the high byte first:
    a real scale (about 1e-3) has none of 0x00 / 0x80 there, so a healthy table costs two scans."""
    high = data[3::4]
    out = []
    for mark in (0x00, 0x80):
        at = high.find(mark)
        while at >= 0:
            if not data[4 * at: 4 * at + 3].strip(b"\0"):
                out.append(at)
            at = high.find(mark, at + 1)
    return sorted(out)


class TableRule:
    """The complete rule of one int8 table, its values fed in blocks of whole rows, in order.

    ``TableRule(scales, hidden)`` applies the scale rule at once; ``feed(first_row, data)`` adds the
    value rules: no -128, and every row whose scale is 0 all zeros. ``problems`` then holds counts
    and the first rows (every kind is reported by row). Stdlib only: the -128 test is a ``memchr``
    (``in``), about 10 GB/s, and zero-scale rows are compared only where the scale is 0.
    """

    def __init__(self, scales: bytes, hidden: int) -> None:
        self.hidden = max(hidden, 1)
        self.problems = scale_problems(scales)
        self._zero = zero_scale_rows(scales)
        self._next = 0  # index into _zero of the first zero-scale row not yet fed
        self._blank = bytes(self.hidden)

    def feed(self, first_row: int, data: bytes) -> None:
        """Judge rows ``first_row ..`` given as their int8 bytes (a whole number of rows)."""
        p = int8_problems(data) if b"\x80" in data else None
        if p:
            self.problems.counts["out-of-range"] = self.problems.counts.get("out-of-range", 0) + p.counts["out-of-range"]
            first = self.problems.first.setdefault("out-of-range", [])
            for i in p.first["out-of-range"]:
                row = first_row + i // self.hidden
                if len(first) < Problems.LIMIT and row not in first:
                    first.append(row)
        end = first_row + len(data) // self.hidden
        zero, h = self._zero, self.hidden
        while self._next < len(zero) and zero[self._next] < end:
            row = zero[self._next]
            self._next += 1
            if row >= first_row and data[(row - first_row) * h: (row - first_row + 1) * h] != self._blank:
                self.problems.add("zero-scale", row)
