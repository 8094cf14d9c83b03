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
