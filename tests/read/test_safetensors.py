"""The header reader: agrees with safetensors' own reader, and any corruption is a HeaderError, never a crash."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import save_file

from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import DTYPE_BITS, HeaderError, parse_header, read_header
from clef_format.verify.run import verify
from tests.support.hostile_cases import ours_accepts, safe_open_accepts

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _valid_file(tmp: Path) -> Path:
    path = tmp / "valid.safetensors"
    save_file({
        "a": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.ones(5, dtype=torch.bfloat16),
        "c": torch.zeros(2, 2, dtype=torch.int8),
        "d": torch.zeros(3, dtype=torch.float8_e4m3fn),
    }, str(path), metadata={"format": "pt"})
    return path


def test_reads_what_safetensors_writes(tmp_path):
    header = read_header(_valid_file(tmp_path))
    with safe_open(str(tmp_path / "valid.safetensors"), framework="pt") as f:
        assert set(f.keys()) == set(header.tensors)
        for k in f.keys():
            assert list(f.get_slice(k).get_shape()) == list(header.tensors[k].shape)
        assert f.metadata() == header.metadata


def _split(raw: bytes) -> tuple[dict, bytes]:
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def _join(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


corruptions = st.one_of(
    st.tuples(st.just("truncate"), st.integers(1, 200)),
    st.tuples(st.just("shift"), st.integers(-64, 64).filter(bool)),
    st.tuples(st.just("dtype"), st.sampled_from(sorted(DTYPE_BITS) + ["F128", "int8", ""])),
    st.tuples(st.just("shape"), st.lists(st.integers(-3, 2**70), min_size=0, max_size=3)),
    st.tuples(st.just("append"), st.integers(1, 64)),
    st.tuples(st.just("length"), st.integers(0, 2**64 - 1)),
    st.tuples(st.just("byte"), st.integers(0, 255)),
)


@SETTINGS
@given(corruption=corruptions, target=st.sampled_from(["a", "b", "c", "d"]), pos=st.integers(0, 10**6))
def test_any_corruption_is_detected_like_safetensors(tmp_path, corruption, target, pos):
    raw = _valid_file(tmp_path).read_bytes()
    header, data = _split(raw)
    kind, arg = corruption
    if kind == "truncate":
        out = raw[: max(0, len(raw) - arg)]
    elif kind == "shift":
        header[target]["data_offsets"][1] += arg
        out = _join(header, data)
    elif kind == "dtype":
        header[target]["dtype"] = arg
        out = _join(header, data)
    elif kind == "shape":
        header[target]["shape"] = arg
        out = _join(header, data)
    elif kind == "append":
        out = raw + b"\0" * arg
    elif kind == "length":
        out = struct.pack("<Q", arg) + raw[8:]
    else:  # flip one byte of the header text
        n = struct.unpack("<Q", raw[:8])[0]
        i = 8 + pos % n
        out = raw[:i] + bytes([arg]) + raw[i + 1:]
    path = tmp_path / "corrupt.safetensors"
    path.write_bytes(out)
    ours = ours_accepts(path)  # never raises anything but HeaderError
    if out == raw:
        assert ours
        return
    assert ours == safe_open_accepts(path), (kind, arg)


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"", "truncated"),
        (struct.pack("<Q", 200_000_000) + b"{}", "header-too-large"),
        (struct.pack("<Q", 50) + b"{}", "truncated"),
        (struct.pack("<Q", 2) + b"\xff\xfe", "not-utf8"),
        (struct.pack("<Q", 2) + b"[]", "not-json"),
        (_join({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a ": {}}, b"\0" * 4)
         .replace(b'"a "', b' "a"'), "duplicate-key"),
        (_join({"a": {"dtype": "F32", "shape": [2**62, 2**62], "data_offsets": [0, 4]}}, b"\0" * 4), "overflow"),
        (_join({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [2, 6]}}, b"\0" * 6), "bad-offsets"),
        (_join({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8), "bad-offsets"),
        (_join({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8), "trailing-bytes"),
        (_join({"__metadata__": {"k": 1}}, b""), "bad-metadata"),
    ],
)
def test_rejections_name_the_reason(tmp_path, raw, reason):
    path = tmp_path / "x.safetensors"
    path.write_bytes(raw)
    with pytest.raises(HeaderError) as exc:
        read_header(path)
    assert exc.value.reason == reason
    assert not safe_open_accepts(path)


def test_parse_header_accepts_padding():
    text = b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}    '
    header = parse_header(text, 8 + len(text) + 2)
    assert header.tensors["a"].shape == (2,)


@SETTINGS
@given(order=st.permutations(["a", "b", "c", "d"]), shards=st.integers(1, 4))
def test_detection_does_not_depend_on_file_order_or_sharding(tmp_path, order, shards):
    """Write the same corrupt tensor set in any order and sharding: verify always says bad-header."""
    base = {
        "a": torch.zeros(3, 4), "b": torch.ones(5, dtype=torch.bfloat16),
        "c": torch.zeros(2, 2, dtype=torch.int8), "d": torch.zeros(3),
    }
    root = tmp_path / f"ck-{'-'.join(order)}-{shards}"
    root.mkdir()
    groups = [order[i::shards] for i in range(shards) if order[i::shards]]
    weight_map = {}
    for i, names in enumerate(groups):
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({k: base[k] for k in names}, str(root / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in names})
    (root / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    victim = root / weight_map["b"]
    victim.write_bytes(victim.read_bytes()[:-1])
    report = verify(str(root))
    bad = [f for f in report.findings if f.code == "bad-header"]
    assert [f.file for f in bad] == [weight_map["b"]]
    assert read_checkpoint(root).bad_headers == {weight_map["b"]}


def _raw_file(tmp: Path, header_text: str, data_len: int) -> Path:
    """A safetensors file whose header JSON is exactly ``header_text`` (key order and duplicates kept)."""
    text = header_text.encode()
    path = tmp / "raw.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"\0" * data_len)
    return path


@pytest.mark.parametrize("entry", [
    '{"shape":[2],"dtype":"F32","data_offsets":[0,8]}',
    '{"data_offsets":[0,8],"shape":[2],"dtype":"F32"}',
    '{"dtype":"F32","data_offsets":[0,8],"shape":[2]}',
])
def test_entry_fields_in_any_order_are_read_like_safetensors(tmp_path, entry: str) -> None:
    path = _raw_file(tmp_path, '{"w":' + entry + '}', 8)
    assert safe_open_accepts(path)
    header = read_header(path)
    assert header.tensors["w"] == ("F32", (2,), 0, 8)


@pytest.mark.parametrize("entry", [
    '{"shape":[2],"dtype":"F32","dtype":"F32","data_offsets":[0,8]}',
    '{"dtype":"F32","shape":[2],"data_offsets":[0,8],"shape":[2]}',
])
def test_a_field_written_twice_in_an_entry_is_a_duplicate_key(tmp_path, entry: str) -> None:
    path = _raw_file(tmp_path, '{"w":' + entry + '}', 8)
    assert not safe_open_accepts(path)
    with pytest.raises(HeaderError) as exc:
        read_header(path)
    assert exc.value.reason == "duplicate-key"
    assert str(exc.value) in ("duplicate key 'dtype' in entry 'w'", "duplicate key 'shape' in entry 'w'")


@pytest.mark.parametrize("offsets, reason", [
    ("[0,8,8]", "bad-offsets"), ("[0]", "bad-offsets"), ("8", "bad-offsets"), ('"08"', "bad-offsets"),
    ("[0.0,8]", "bad-offsets"), ("[0,8.0]", "bad-offsets"), ("[-1,7]", "bad-offsets"), ('["0",8]', "bad-offsets"),
])
def test_data_offsets_that_are_not_two_byte_positions_are_refused_like_safetensors(tmp_path, offsets: str,
                                                                                      reason: str) -> None:
    path = _raw_file(tmp_path, '{"w":{"dtype":"F32","shape":[2],"data_offsets":' + offsets + '}}', 8)
    assert not safe_open_accepts(path)
    with pytest.raises(HeaderError) as exc:
        read_header(path)
    assert exc.value.reason == reason
    assert str(exc.value) == f"tensor 'w' has invalid data_offsets {json.loads(offsets)!r}"


@pytest.mark.parametrize("entry", ["1", '"F32"', "[1, 2]", "null"])
def test_an_entry_that_is_not_an_object_is_a_bad_entry(tmp_path, entry: str) -> None:
    path = _raw_file(tmp_path, '{"w":' + entry + '}', 0)
    assert not safe_open_accepts(path)
    with pytest.raises(HeaderError) as exc:
        read_header(path)
    assert (exc.value.reason, str(exc.value)) == ("bad-entry", "entry 'w' is not an object")


@pytest.mark.parametrize("raw, reason, message", [
    (b"\xff{}", "not-utf8", "header is not valid UTF-8 (invalid start byte at byte 0)"),
    (b'{"a": \xc3', "not-utf8", "header is not valid UTF-8 (unexpected end of data at byte 6)"),
    (b'{"a": ', "not-json", "header is not valid JSON: Expecting value: line 1 column 7 (char 6)"),
    (b"{} []", "not-json", "header is not valid JSON: Extra data: line 1 column 4 (char 3)"),
])
def test_undecodable_headers_say_where_they_break(tmp_path, raw: bytes, reason: str, message: str) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)
    assert not safe_open_accepts(path)
    with pytest.raises(HeaderError) as exc:
        read_header(path)
    assert (exc.value.reason, str(exc.value)) == (reason, message)


@pytest.mark.parametrize("lead, accepted", [(" ", True), ("\n", True), ("\t", True), ("\r", True), (" \n\t\r ", True),
                                            ("\x0c", False), ("\u00a0", False), ("x", False)])
def test_whitespace_before_the_header_object_is_judged_like_safetensors(tmp_path, lead: str, accepted: bool) -> None:
    """JSON whitespace (space, tab, newline, return) may precede the header's '{', as safetensors' own
    reader allows; anything else may not."""
    path = _raw_file(tmp_path, lead + '{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8)
    assert safe_open_accepts(path) is accepted
    if accepted:
        assert read_header(path).tensors["w"] == ("F32", (2,), 0, 8)
    else:
        with pytest.raises(HeaderError):
            read_header(path)


@pytest.mark.parametrize("shape, offsets", [("[0]", "[0,0]"), ("[4,0]", "[0,0]"), ("[0,3]", "[0,0]")])
def test_an_empty_tensor_is_valid_like_safetensors(tmp_path, shape: str, offsets: str) -> None:
    """A dimension of 0 is an empty tensor (0 bytes), which safetensors writes and reads."""
    path = _raw_file(tmp_path, '{"e":{"dtype":"F32","shape":' + shape + ',"data_offsets":' + offsets + '},'
                     '"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 8)
    assert safe_open_accepts(path)
    header = read_header(path)
    assert header.tensors["e"] == ("F32", tuple(json.loads(shape)), 0, 0)
    assert header.tensors["w"] == ("F32", (2,), 0, 8)


@pytest.mark.parametrize("entry, data_len, reason, message", [
    ('{"dtype":"F128","shape":[2],"data_offsets":[0,8]}', 8, "bad-dtype", "tensor 'w' has unknown dtype 'F128'"),
    ('{"dtype":"f32","shape":[2],"data_offsets":[0,8]}', 8, "bad-dtype", "tensor 'w' has unknown dtype 'f32'"),
    ('{"shape":[2],"data_offsets":[0,8]}', 8, "bad-dtype", "tensor 'w' has unknown dtype None"),
    ('{"dtype":"F32","shape":[-1],"data_offsets":[0,8]}', 8, "bad-shape", "tensor 'w' has an invalid shape [-1]"),
    ('{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}', 8, "bad-shape", "tensor 'w' has an invalid shape [2.0]"),
    ('{"dtype":"F32","shape":2,"data_offsets":[0,8]}', 8, "bad-shape", "tensor 'w' has an invalid shape 2"),
    ('{"dtype":"F32","shape":[2],"data_offsets":[8,0]}', 8, "bad-offsets", "tensor 'w' ends before it begins (8, 0)"),
])
def test_bad_dtype_shape_and_reversed_offsets_name_the_reason_and_tensor(tmp_path, entry: str, data_len: int,
                                                                         reason: str, message: str) -> None:
    path = _raw_file(tmp_path, '{"w":' + entry + '}', data_len)
    assert not safe_open_accepts(path)
    with pytest.raises(HeaderError) as exc:
        read_header(path)
    assert (exc.value.reason, str(exc.value)) == (reason, message)


@pytest.mark.parametrize("header_text, data_len, reason, message", [
    ("[]", 0, "not-json", "header does not start with '{'"),
    (' "w"', 0, "not-json", "header does not start with '{'"),
    ('{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 12, "trailing-bytes",
     "data buffer holds 12 bytes but the tensors cover 8"),
    ('{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 5, "truncated",
     "data buffer holds 5 bytes but the tensors cover 8 (file truncated?)"),
])
def test_a_header_that_is_no_object_or_a_buffer_of_the_wrong_size_says_so(tmp_path, header_text: str, data_len: int,
                                                                          reason: str, message: str) -> None:
    path = _raw_file(tmp_path, header_text, data_len)
    assert not safe_open_accepts(path)
    with pytest.raises(HeaderError) as exc:
        read_header(path)
    assert (exc.value.reason, str(exc.value)) == (reason, message)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_python_only_json_constants_in_a_header_are_refused_like_safetensors(tmp_path, constant: str) -> None:
    """Python's json reads NaN/Infinity; safetensors' reader refuses the file (found by the generated corpus)."""
    from safetensors import safe_open

    from clef_format.read.safetensors import HeaderError, read_header

    header = ('{"t0": {"dtype": "F32", "shape": [], "data_offsets": [0, 4], "extra": %s}}' % constant).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    with pytest.raises(Exception):
        with safe_open(path, "np"):
            pass
    with pytest.raises(HeaderError) as err:
        read_header(path)
    assert err.value.reason == "not-json" and constant.lstrip("-") in str(err.value)
