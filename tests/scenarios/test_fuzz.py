"""Bounded fuzzing (hypothesis) of the header reader and the config readers: zero crashes, zero hangs.

"Crash" = any exception other than the reader's own error type; for ``read_checkpoint`` and the
checks, any exception at all (they turn bad content into findings). Budgets are fixed
(``max_examples``, ``deadline=None``) so CI time is bounded on 2-core machines.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clef_format.read.checkpoint import read_checkpoint
from clef_format.read.safetensors import DTYPE_BITS, HeaderError, parse_header, read_header
from clef_format.spec import layouts as L
from clef_format.spec.joint_head import HeadConfigError, parse_head_config
from clef_format.spec.marker import MarkerError, parse_marker
from clef_format.spec.model_spec import ConfigError, linear_modules, parse_config, plain_params
from clef_format.verify.checks import CHECKS
from tests.support.hostile_cases import pristine

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)), max_leaves=12)


# ------------------------------------------------------------------ safetensors headers

@FUZZ
@given(st.binary(max_size=512), st.integers(0, 2**64 - 1))
def test_parse_header_arbitrary_bytes(raw: bytes, file_size: int) -> None:
    try:
        parse_header(raw, file_size)
    except HeaderError:
        pass


entry = st.fixed_dictionaries({
    "dtype": st.one_of(st.sampled_from(sorted(DTYPE_BITS)), json_leaf),
    "shape": st.one_of(st.lists(st.integers(-2, 2**65), max_size=4), st.lists(st.integers(0, 6), max_size=3),
                       json_value),
    "data_offsets": st.one_of(st.lists(st.integers(-1, 2**65), min_size=2, max_size=2),
                              st.tuples(st.integers(0, 64), st.integers(0, 64)).map(list), json_value),
})


@FUZZ
@given(st.dictionaries(st.text(max_size=8), st.one_of(entry, json_value), max_size=5),
       st.one_of(st.none(), st.dictionaries(st.text(max_size=5), json_leaf, max_size=3)),
       st.integers(0, 4096))
def test_parse_header_structured(entries: dict[str, Any], metadata: Any, buffer: int) -> None:
    header = dict(entries)
    if metadata is not None:
        header["__metadata__"] = metadata
    raw = json.dumps(header).encode()
    try:
        h = parse_header(raw, 8 + len(raw) + buffer)
    except HeaderError:
        return
    # accepted: the tensors tile the buffer exactly and every size is numel x dtype
    end = 0
    for info in sorted(h.tensors.values(), key=lambda t: t.begin):
        assert info.begin == end
        assert info.nbytes * 8 == info.numel * DTYPE_BITS[info.dtype]
        end = info.end
    assert end == buffer


@FUZZ
@given(st.binary(max_size=64), st.integers(0, 2**64 - 1), st.booleans())
def test_read_header_arbitrary_files(body: bytes, claimed: int, with_prefix: bool) -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "f.safetensors"
        p.write_bytes((struct.pack("<Q", claimed) if with_prefix else b"") + body)
        try:
            read_header(p)
        except HeaderError:
            pass


# ------------------------------------------------------------------ config readers

@FUZZ
@given(json_value)
def test_parse_config_arbitrary_json(value: Any) -> None:
    try:
        parse_config(value)
    except ConfigError:
        pass


def _real_config() -> dict[str, Any]:
    return json.loads((pristine() / L.CONFIG).read_text())


@FUZZ
@given(st.data())
def test_parse_config_mutated_real_config(data: st.DataObject) -> None:
    """Replace one value somewhere in a real config with anything JSON; parsing and the tensor tree never crash."""
    config = _real_config()
    node: Any = config
    for _ in range(data.draw(st.integers(1, 3))):
        if not isinstance(node, dict) or not node:
            break
        key = data.draw(st.sampled_from(sorted(node)))
        if isinstance(node[key], dict) and data.draw(st.booleans()):
            node = node[key]
            continue
        node[key] = data.draw(st.one_of(json_value, st.integers(-2**70, 2**70)))
        break
    try:
        cfg = parse_config(config)
    except ConfigError:
        return
    if cfg.text.num_layers <= 4096 and (cfg.vision is None or cfg.vision.depth <= 4096):
        linear_modules(cfg)
        plain_params(cfg)


@FUZZ
@given(st.one_of(json_value, st.dictionaries(st.sampled_from(
    ["hidden_size", "width", "routing_layers", "layers", "heads", "feedforward", L.MARKER_KEY, "x"]),
    st.one_of(st.integers(-5, 2**40), json_leaf), max_size=8)))
def test_parse_head_config(value: Any) -> None:
    try:
        parse_head_config(value)
    except HeadConfigError:
        pass


@FUZZ
@given(st.one_of(json_leaf, st.text(alphabet="<>=!~.*,0123456789abrcpost+ ", max_size=30)))
def test_parse_marker(value: Any) -> None:
    try:
        parse_marker(value)
    except MarkerError:
        pass


_FILES = [L.CONFIG, L.HEAD_CONFIG, L.BACKBONE_INDEX, "clef_manifest.json"]


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_FILES), st.one_of(json_value, st.binary(max_size=64)), st.booleans())
def test_read_checkpoint_and_checks_never_raise(rel: str, content: Any, deep_manifest: bool) -> None:
    """Any content in any config file of a real checkpoint: findings, never an exception."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "ck"
        shutil.copytree(pristine(), root)
        (root / rel).write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())
        ck = read_checkpoint(root)
        for check in CHECKS:
            list(check(ck))
        if rel == "clef_manifest.json" and deep_manifest:
            from clef_format.read.manifest import read_manifest

            read_manifest(ck)


def test_atheris_fuzz_30s(tmp_path: Path) -> None:
    """libFuzzer-guided fuzzing for a fixed time (CLEF_FUZZ_SECONDS, default 30) with real seeds; zero crashes."""
    import importlib.util
    import os
    import subprocess
    import sys

    import pytest

    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed")
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    raw = (pristine() / L.HEAD_WEIGHTS).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    (seeds / "header").write_bytes(b"\0" + (len(raw) - 8 - n - 4).to_bytes(4, "little") + raw[8:8 + n])
    (seeds / "config").write_bytes(b"\1" + (pristine() / L.CONFIG).read_bytes())
    (seeds / "head").write_bytes(b"\2" + (pristine() / L.HEAD_CONFIG).read_bytes())
    (seeds / "marker").write_bytes(b'\3{"requires_clef_vllm": ">=0.2.0,<1"}')
    (tmp_path / "corpus").mkdir()
    seconds = os.environ.get("CLEF_FUZZ_SECONDS", "30")
    script = Path(__file__).with_name("fuzz_atheris.py")
    proc = subprocess.run([sys.executable, str(script), f"-max_total_time={seconds}", "-rss_limit_mb=2048",
                           "-max_len=4096", "-timeout=10", str(tmp_path / "corpus"), str(seeds)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=int(seconds) + 120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    tail = proc.stderr[-1500:]
    crashes = list(tmp_path.glob("crash-*")) + list(tmp_path.glob("timeout-*")) + list(tmp_path.glob("oom-*"))
    assert not crashes, [c.read_bytes()[:200] for c in crashes]
    assert proc.returncode == 0, f"exit {proc.returncode}: {tail}"
