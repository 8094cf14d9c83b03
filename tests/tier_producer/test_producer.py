"""Real llm-compressor outputs, dressed as Clef checkpoints, against what vLLM itself does with them.

Per output (scripts/producer-outputs.sh made them; tests/tier_producer/generate.py says how):
- the tool's verdict (``clef-format verify --json --vllm-version V``) is OK exactly when vLLM, on
  the CPU, builds its own model class without error, its own ``load_weights`` takes every tensor,
  every parameter but its own defaults is written, ``process_weights_after_loading`` runs and
  nothing is logged beyond what vLLM says about the machine (tests/tier_producer/vllm_load.py);
- the per-layer view (``clef-format layers --json``) equals the schemes vLLM's layers were built with;
- on every OK output ``clef-format migrate --to layout-2`` succeeds, the result verifies OK and
  every tensor but the two moved tables is byte-identical.
Nothing here knows what any output's verdict should be: both sides are computed live. Each row is
also written to ``$CLEF_PRODUCER_REPORT`` (default build/producer-<version>.json) for docs/VLLM.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.tier_producer import vllm_load as V

OUTPUTS = Path(os.environ.get("CLEF_PRODUCER_OUTPUTS", "."))
REPORT = Path(os.environ.get("CLEF_PRODUCER_REPORT")
              or Path(__file__).resolve().parents[2] / "build" / f"producer-{V.VERSION}.json")
NAMES = sorted(p.stem for p in OUTPUTS.glob("*.json"))
ROWS: dict[str, dict[str, Any]] = {}
REFERENCE = "bf16"


def clef(*args: str) -> tuple[int, dict[str, Any]]:
    """The CLI of this tree, as a user runs it, in this env."""
    proc = subprocess.run([sys.executable, "-m", "clef_format", *args, "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert proc.returncode in (0, 1), f"clef-format {' '.join(args)} could not run (rc {proc.returncode}):\n{proc.stderr[-2000:]}"
    return proc.returncode, json.loads(proc.stdout)


def tool_view(layers: dict[str, Any]) -> dict[str, Any]:
    """``clef-format layers --json`` in the oracle's terms."""
    other = layers.get("other", {})
    vision = other.get("vision")
    return {"rows": {r["index"]: dict(r["groups"]) for r in layers.get("rows", [])},
            "vision": [] if vision is None else [vision], "lm_head": other.get("lm_head")}


def _tensors(root: Path) -> dict[str, bytes]:
    from safetensors import safe_open

    out: dict[str, bytes] = {}
    for path in sorted(root.glob("*.safetensors")):
        with safe_open(str(path), framework="pt", device="cpu") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                out[name] = t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return out


@pytest.fixture(scope="module")
def reference() -> V.Outcome:
    """vLLM on the unquantized output: what it says there is about the machine, not a checkpoint."""
    assert (OUTPUTS / REFERENCE).is_dir(), f"no {REFERENCE} output in {OUTPUTS}"
    return V.calibrate_noise(OUTPUTS / REFERENCE)


@pytest.fixture(scope="module", autouse=True)
def _report() -> Any:
    yield
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps({"vllm": V.VERSION, "rows": ROWS}, indent=1, sort_keys=True) + "\n")
    from vllm.distributed import parallel_state as ps

    ps.destroy_model_parallel()
    ps.destroy_distributed_environment()


@pytest.mark.vllm
@pytest.mark.parametrize("name", NAMES)
def test_producer_output(name: str, reference: V.Outcome, tmp_path: Path) -> None:
    info = json.loads((OUTPUTS / f"{name}.json").read_text())
    row: dict[str, Any] = {"recipe": info.get("recipe"), "produced": info["error"] is None}
    ROWS[name] = row
    if info["error"]:
        row["note"] = info["error"]
        pytest.skip(f"llm-compressor {info['llmcompressor']} could not produce it on CPU: {info['error']}")
    src = OUTPUTS / name
    real = reference if name == REFERENCE else V.load(src)
    _, verdict = clef("verify", str(src), "--vllm-version", V.VERSION)
    _, layers = clef("layers", str(src), "--vllm-version", V.VERSION)
    errors = [f["code"] for f in verdict["findings"] if f["severity"] == "error"]
    row.update(tool="OK" if verdict["ok"] else "BROKEN", tool_errors=errors, vllm="OK" if real.ok else "BROKEN",
               vllm_says=real.summary(), stand_ins=real.stand_ins)
    problems: list[str] = []
    if verdict["ok"] != real.ok:
        problems.append(f"verdict: clef-format {row['tool']} {errors}, vLLM {V.VERSION} {row['vllm']}: {real.summary()}")
    if real.stage not in ("config", "build"):
        mine, theirs = tool_view(layers), real.layers
        diff = {i: (mine["rows"].get(i), theirs["rows"].get(i)) for i in set(mine["rows"]) | set(theirs["rows"])
                if mine["rows"].get(i) != theirs["rows"].get(i)}
        for part in ("vision", "lm_head"):
            if mine[part] != theirs[part]:
                diff[part] = (mine[part], theirs[part])
        row["layers_agree"] = not diff
        row["layer_decisions"] = sum(len(g) for g in theirs["rows"].values()) + 2
        if diff:
            problems.append(f"per-layer view differs from vLLM's: {dict(list(diff.items())[:3])}")
    if real.ok:
        row["migrate"] = _migrate_ok(src, tmp_path, problems)
    assert not problems, f"{name}: " + "\n".join(problems)


def _migrate_ok(src: Path, tmp_path: Path, problems: list[str]) -> bool:
    """Layout 1 -> 2 on a copy; every tensor but the moved tables byte-identical; the result verifies OK."""
    dst = tmp_path / "ck"
    shutil.copytree(src, dst)
    rc, out = clef("migrate", str(dst), "--to", "layout-2")
    if rc != 0:
        problems.append(f"migrate failed: {[f['code'] for f in out.get('findings', [])]}")
        return False
    _, verdict = clef("verify", str(dst), "--vllm-version", V.VERSION)
    if not verdict["ok"] or verdict["layout"] != "layout-2":
        errors = [f["code"] for f in verdict["findings"] if f["severity"] == "error"]
        problems.append(f"migrated copy: {verdict['layout']}, errors {errors}")
    before, after = _tensors(src), _tensors(dst)
    moved = set(before) - set(after)
    if not all(n.endswith(("embed_tokens.weight", "lm_head.weight")) for n in moved) or set(after) - set(before):
        problems.append(f"migrate moved {sorted(moved)}, added {sorted(set(after) - set(before))}")
    changed = [n for n in after if n in before and after[n] != before[n]]
    if changed:
        problems.append(f"migrate changed tensors: {changed[:5]}")
    head = "clef_head/joint_head.safetensors"
    if (src / head).read_bytes() != (dst / head).read_bytes():
        problems.append("migrate changed the joint head")
    return not problems
