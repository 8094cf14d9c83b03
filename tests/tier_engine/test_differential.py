"""The differential: single mutations of the engine baselines (mutations.py), each judged by
clef-format and by a real engine, and the two verdicts held against each other.

Per mutation, on a copy of its baseline (``bare``: no reference, as the tier builds it) and on a
copy whose baseline was given a ``clef_manifest.json`` before the edit (``manifest``: a download
that carries its references, as migrate's output or the HF cache does):

- ``verify``: clef-format's structure verdict, ``verify --deep`` on both copies (what the gate
  also runs lives there: the table rule, the recorded digests, the tokenizer, the scales, hashing);
- ``gate``: the shipped plugin's start-up gate (``hooks.check_checkpoint`` with the plugin's
  version and the running vLLM), on both copies, in this process: it refuses in the plugin's
  model constructor, before any weight is read, so the shipped engine would stop right there
  (test_refusals.py shows that in whole engines);
- ``engine``: the bare copy served by the ungated build of the plugin (one engine start): it logs
  what the gate refuses and serves anyway, so the engine itself says whether the checkpoint
  starts and serves the baseline's answers (compare.py's tolerances against the baseline's
  transformers reference): ``right``, ``wrong`` or ``fails``.

The tier fails on a false OK that a fact could tell (``Mutation.told_by``): a stated rule on the
bare copy, the download reference on the manifest copy. Every case's verdicts must equal its row
in docs/ENGINE.md ("The differential"), where every disagreement has its reason.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

import checkpoints as C
import compare
import mutations as M
from engines import PROMPTS, UNGATED, engine_kwargs
from reference import Reference, logprob_gap, reference, served_logprobs
from test_serve_fp8 import FP8_TOL

from clef_format.errors import IncompatibleError
from clef_format.spec import layouts as L

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ENGINE.md"
COLUMNS = ("verify", "deep", "deep+manifest", "gate", "gate+manifest", "engine")
#: what the ungated build writes for each refusal it carries on past (clef_vllm.model.UNGATED_REFUSAL)
REFUSAL_LOGGED = re.compile(r"clef-vllm ungated build: refused and served anyway \(([^)]*)\): \[([a-z0-9-]+)\]")


def _verdict(errors: list[Any]) -> str:
    return f"BROKEN {errors[0].code}" if errors else "OK"


def verify_verdict(root: Path, deep: bool) -> str:
    from clef_format.read.checkpoint import open_checkpoint
    from clef_format.verify.run import verify_checkpoint
    from clef_format.vllm.gate import running_vllm

    from engines import NEW

    ck = open_checkpoint(str(root))
    ck.vllm_version = running_vllm()  # the vLLM that serves it, as the gate uses
    report = verify_checkpoint(ck, str(root), plugin_version=NEW, deep=deep)  # the plugin the engine runs
    return _verdict([f for f in report.findings if f.severity == "error"])


def gate_verdict(root: Path) -> str:
    from clef_format import vllm as hooks

    from engines import NEW

    try:
        hooks.check_checkpoint(str(root), NEW)
    except IncompatibleError as exc:
        return f"BROKEN {exc.code}"
    return "OK"


@dataclass
class Case:
    mutation: M.Mutation
    verdicts: dict[str, str]
    logged: list[tuple[str, str]]  # (hook, code) the ungated build logged
    gaps: list[dict[str, float]]
    error: str | None

    def row(self) -> list[str]:
        return [self.verdicts[c] for c in COLUMNS]


@pytest.fixture(scope="session")
def baselines(checkpoint: Callable, scratch: Path) -> dict[str, dict[str, Path]]:
    """baseline -> {"bare": copy, "manifest": copy with clef_manifest.json written by clef-format's writer}."""
    from clef_format.migrate.manifest_writer import make_manifest

    out: dict[str, dict[str, Path]] = {}
    for name in sorted({m.baseline for m in M.MUTATIONS}):
        src = checkpoint(name)
        bare = scratch / "diff-base" / name / "bare"
        shutil.copytree(src, bare)
        with_ref = scratch / "diff-base" / name / "manifest"
        shutil.copytree(src, with_ref)
        report = make_manifest(str(with_ref))
        assert report.details.get("written"), report.findings
        out[name] = {"bare": bare, "manifest": with_ref}
    return out


@pytest.fixture(scope="session")
def references(checkpoint: Callable) -> dict[str, Reference]:
    """The baselines' transformers references (the 2-shard copy holds layout-2's tensors)."""
    from safetensors.torch import load_file

    single = checkpoint(M.B)
    refs = {M.B: reference(single, C.decoded_tables(single), PROMPTS)}
    fp8 = checkpoint(M.F)
    refs[M.F] = reference(fp8, C.decoded_tables(fp8), PROMPTS)
    sharded = checkpoint(M.S)
    tensors: dict[str, torch.Tensor] = {}
    for f in sorted(sharded.glob("model-*.safetensors")):
        tensors.update(load_file(f))
    base = load_file(single / L.BACKBONE_SINGLE)
    assert tensors.keys() == base.keys() and all(torch.equal(tensors[k], base[k]) for k in base)
    refs[M.S] = refs[M.B]
    return refs


def _judge(served: list[dict], ref: Reference, fp8: bool) -> tuple[str, list[dict[str, float]]]:
    gaps = []
    for i, result in enumerate(served):
        entries = served_logprobs(result)
        finite = all(torch.isfinite(torch.tensor([v for _, _, v in entries])))
        tol = FP8_TOL if fp8 else compare.logprob_tolerance(ref, entries, i)
        gap = logprob_gap(entries, ref.fp32, i) if finite else float("inf")
        gaps.append({"err": gap, "tol": tol})
    return ("right" if all(g["err"] <= g["tol"] for g in gaps) else "wrong"), gaps


@pytest.fixture(scope="session")
def differential(engines: Any, baselines: dict, references: dict, scratch: Path, record: Callable) -> Callable:
    """``differential(id)``: the mutation's verdicts (computed once; one engine start)."""
    cache: dict[str, Case] = {}

    def run(mid: str) -> Case:
        if mid in cache:
            return cache[mid]
        m = M.BY_ID[mid]
        bare = M.make(m, baselines[m.baseline]["bare"], scratch / "diff" / mid / "bare")
        with_ref = M.make(m, baselines[m.baseline]["manifest"], scratch / "diff" / mid / "manifest")
        v = {"verify": verify_verdict(bare, deep=False), "deep": verify_verdict(bare, deep=True),
             "deep+manifest": verify_verdict(with_ref, deep=True), "gate": gate_verdict(bare),
             "gate+manifest": gate_verdict(with_ref)}
        engine = engines.get(f"{mid} [{UNGATED}] generate", bare, UNGATED, **engine_kwargs(bare))
        logged = [(hook, code) for hook, code in REFUSAL_LOGGED.findall(engine.log)]
        gaps: list[dict[str, float]] = []
        if engine.ok:
            v["engine"], gaps = _judge(engine.generate(PROMPTS), references[m.baseline], fp8=m.baseline == M.F)
        else:
            v["engine"] = "fails"
        case = Case(m, v, logged, gaps, engine.error)
        record(f"differential {mid}", {**v, "logged": logged, "gaps": gaps,
                                       "error": (engine.error or "")[:160]})
        cache[mid] = case
        return case

    return run


def documented() -> dict[str, list[str]]:
    """docs/ENGINE.md's differential table: id -> [verify, deep, ..., engine, reason]."""
    text = DOCS.read_text()
    section = text.split("## The differential", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == len(COLUMNS) + 2:
            rows[cells[0].strip("`")] = [c.replace("`", "") for c in cells[1:]]
    return rows


def broken(verdict: str) -> bool:
    return verdict.startswith("BROKEN")


@pytest.mark.parametrize("mid", [m.id for m in M.MUTATIONS])
def test_mutation(differential: Callable, mid: str) -> None:
    case = differential(mid)
    m, v = case.mutation, case.verdicts
    engine_broken = v["engine"] != "right"
    # the gate run here is the gate the engine ran: its start-up refusal is the one the ungated build logged
    # (or the engine stopped before the model was built: the front end loads the tokenizer first)
    at_start = [code for hook, code in case.logged if hook == "start-up gate"]
    if at_start:
        assert broken(v["gate"]) and at_start[0] == v["gate"].split()[1], (v, case.logged)
    else:
        assert not broken(v["gate"]) or v["engine"] == "fails", (v, case.logged)
    if m.kind == "none":  # the control: nothing to find, served right
        assert not any(broken(v[c]) for c in COLUMNS[:-1]) and v["engine"] == "right", v
    # no false OK that a fact could tell
    if engine_broken and m.told_by == "rule":
        assert broken(v["gate"]), f"false OK: the shipped plugin serves {m.what} ({v})"
        assert broken(v["deep"]), f"false OK: verify --deep passes {m.what} ({v})"
    if engine_broken and m.told_by in ("rule", "reference"):
        assert broken(v["gate+manifest"]), f"false OK: the gate passes {m.what} with a manifest that tells ({v})"
        assert broken(v["deep+manifest"]), f"false OK: verify --deep passes {m.what} with a manifest ({v})"
    # what clef-format says here is what docs/ENGINE.md says, and each disagreement has its reason
    docs = documented()
    assert mid in docs, f"docs/ENGINE.md has no row for {mid}: | `{mid}` | {' | '.join(case.row())} | reason |"
    assert docs[mid][:-1] == case.row(), f"docs/ENGINE.md's row for {mid} is stale; observed: {case.row()}"
    disagree = [c for c in COLUMNS[:-1] if broken(v[c]) != engine_broken]
    if disagree:
        assert docs[mid][-1] not in ("", "-"), f"{mid}: {disagree} disagree with the engine: docs/ENGINE.md gives no reason"


def test_docs_list_only_cases_that_exist() -> None:
    assert set(documented()) == set(M.BY_ID)
