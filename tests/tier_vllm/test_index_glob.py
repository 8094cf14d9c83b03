"""spec.layouts.vllm_globs against vLLM's own loader code: the files DefaultModelLoader globs
(``*.safetensors``) and the weight_map strings ``filter_duplicate_safetensors_files`` accepts."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import pytest

from clef_format.spec.layouts import vllm_globs

VALUES = ["a.safetensors", "./a.safetensors", "sub/../a.safetensors", "sub/a.safetensors", ".h.safetensors",
          "a.safetensors/", "A.SAFETENSORS", "a.bin"]


@pytest.mark.vllm
@pytest.mark.parametrize("value", VALUES)
def test_an_index_value_is_accepted_by_vllm_exactly_when_vllm_globs_says_so(tmp_path: Path, value: str) -> None:
    from vllm.model_executor.model_loader.weight_utils import filter_duplicate_safetensors_files

    for rel in ("a.safetensors", ".h.safetensors", "sub/a.safetensors", "a.bin", "A.SAFETENSORS"):
        (tmp_path / rel).parent.mkdir(exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    folder = str(tmp_path)
    files = glob.glob(os.path.join(folder, "*.safetensors"))  # DefaultModelLoader's pattern
    assert sorted(os.path.relpath(f, folder) for f in files) == ["a.safetensors"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"t": value}}))
    try:
        filter_duplicate_safetensors_files(files, folder, "model.safetensors.index.json")
        accepted = True
    except FileNotFoundError:
        accepted = False
    assert accepted == vllm_globs(value)
