"""A download whose bytes are not the download's stops a whole engine at start-up: the plugin's gate
hashes every file the engine reads against its ``--local-dir`` metadata etags (written by
huggingface_hub's own ``write_download_metadata``) before vLLM loads any weight.

One changed bit in a BF16 backbone weight: no header, no rule, no recorded digest sees it (the
served model would just be slightly off); only the download's etag does."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable

from engines import NEW, engine_kwargs

from clef_format.read.safetensors import read_header


def _local_dir_download(src: Path, dest: Path) -> Path:
    from huggingface_hub._local_folder import write_download_metadata

    from tests.support.hub_cache import default_lfs, etag_of, fake_commit

    shutil.copytree(src, dest)
    for path in sorted(p for p in dest.rglob("*") if p.is_file()):
        rel = path.relative_to(dest).as_posix()
        write_download_metadata(dest, rel, fake_commit("org/clef-tiny"), etag_of(path, default_lfs(rel, path.stat().st_size)))
    return dest


def test_a_changed_weight_is_refused_at_start_up_before_loading(engines: Any, checkpoint: Callable,
                                                                tmp_path: Path) -> None:
    root = _local_dir_download(checkpoint("layout-2"), tmp_path / "local")
    backbone = next(p for p in sorted(root.glob("*.safetensors")))
    header = read_header(backbone)
    name = next(n for n, t in sorted(header.tensors.items()) if t.dtype == "BF16" and n.endswith("proj.weight"))
    at = header.data_start + header.tensors[name].begin
    data = bytearray(backbone.read_bytes())
    data[at] ^= 0x01  # the lowest mantissa bit of one element
    backbone.write_bytes(bytes(data))

    engine = engines.get("layout-2 local-dir one bit changed", root, NEW, **engine_kwargs(root))
    assert not engine.ok and engine.error
    log = engine.log
    line = next(ln for ln in log.splitlines() if "[hash-mismatch]" in ln)
    assert backbone.name in line and "local_dir download metadata" in line
    assert "--force-download" in log and "clef_vllm/model.py" in log  # the plugin's gate, in the constructor
    assert "Loading weights took" not in log  # before vLLM loaded any weight
