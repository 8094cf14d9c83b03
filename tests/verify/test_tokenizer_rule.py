"""The tokenizer rule of ``--deep`` and the gate against the real ``tokenizers`` library, case by case."""

from __future__ import annotations

from pathlib import Path

import pytest

from clef_format.compat import IncompatibleError, check_checkpoint
from clef_format.verify.checks.startup import tokenizer_problem
from clef_format.verify.run import verify
from tests.support.hostile_cases import fresh_copy, pristine

tokenizers = pytest.importorskip("tokenizers")

VALID = (pristine() / "tokenizer.json").read_bytes()

CASES = {
    "empty": b"",
    "empty-object": b"{}",
    "nan": b'{"version":"1.0","x":NaN}',
    "infinity": b'{"version":"1.0","model":{"type":"BPE","vocab":{},"merges":[]},"x":-Infinity}',
    "bom": b"\xef\xbb\xbf" + VALID,
    "model-list": b'{"model":[]}',
    "model-null": b'{"model":null}',
    "model-empty": b'{"model":{}}',
    "array": b"[]",
    "valid": VALID,
    "word-level": b'{"model":{"type":"WordLevel","vocab":{},"unk_token":"x"}}',
    "unigram": b'{"model":{"type":"Unigram","vocab":[]}}',
    # the necessary condition holds, the library's schema does not (no type it can build from these fields)
    "vocab-only": b'{"model":{"vocab":{}}}',
    "bpe-without-merges": b'{"model":{"type":"BPE","vocab":{}}}',
    "word-level-without-unk": b'{"model":{"type":"WordLevel","vocab":{}}}',
    "unknown-type": b'{"model":{"type":"Mystery","vocab":{}}}',
}


def _loads(path: Path) -> bool:
    try:
        tokenizers.Tokenizer.from_file(str(path))
    except Exception:  # the library raises a bare Exception for every parse error
        return False
    return True


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_rule_agrees_with_the_tokenizers_library(name: str, tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    path.write_bytes(CASES[name])
    assert (tokenizer_problem("tokenizer.json", CASES[name]) is None) == _loads(path)


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_rule_without_the_library_never_refuses_what_it_loads(name: str, tmp_path: Path) -> None:
    """Where tokenizers is not importable the rule is a necessary condition only: it may pass a file the
    library refuses, never refuse one it loads."""
    path = tmp_path / "tokenizer.json"
    path.write_bytes(CASES[name])
    if _loads(path):
        assert tokenizer_problem("tokenizer.json", CASES[name], use_library=False) is None


@pytest.mark.parametrize("name", ["empty", "empty-object", "nan", "bom", "vocab-only", "unknown-type"])
def test_deep_and_the_gate_refuse_a_tokenizer_the_engine_cannot_load(name: str, tmp_path: Path) -> None:
    root = fresh_copy(tmp_path / "ck")
    (root / "tokenizer.json").write_bytes(CASES[name])
    deep = [f for f in verify(str(root), deep=True).findings if f.severity == "error"]
    assert [(f.code, f.file) for f in deep] == [("bad-config", "tokenizer.json")]
    with pytest.raises(IncompatibleError) as exc:
        check_checkpoint(root, "0.2.1")
    assert exc.value.code == "bad-config"


def test_a_key_twice_with_different_values_is_a_warning_and_the_library_takes_the_last(tmp_path: Path) -> None:
    """The tokenizers library loads a tokenizer.json whose "model" is written twice, with the last one (a fact
    read from the library, not assumed): verify --deep and the gate warn, naming the key, and do not refuse."""
    first = '{"type":"BPE","vocab":{"a":0},"merges":[]}'
    last = '{"type":"WordLevel","vocab":{"a":0,"b":1},"unk_token":"a"}'
    data = ('{"version":"1.0","model":' + first + ',"model":' + last + '}').encode()
    (tmp_path / "t.json").write_bytes(data)
    assert type(tokenizers.Tokenizer.from_file(str(tmp_path / "t.json")).model).__name__ == "WordLevel"
    root = fresh_copy(tmp_path / "ck")
    (root / "tokenizer.json").write_bytes(data)
    found = [f for f in verify(str(root), deep=True).findings if f.file == "tokenizer.json"]
    assert [(f.code, f.severity) for f in found] == [("bad-config", "warning")]
    assert "'model' twice with different values" in found[0].message and "last" in found[0].message
    check_checkpoint(root, "0.2.1")  # served: every loader reads the same (last) value
