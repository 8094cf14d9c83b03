"""Quantization patterns against vLLM's module names: the findings that stop silent BF16 and load failures.

Three views of every layer meet here: what the quantizer applied (HF names, compressed-tensors'
rules), what the stored tensors are, and what vLLM will build (``resolve``). Where they differ,
a finding names the modules, the pattern and, when one can be derived and checked, a fix.
Findings about many layers are folded into one, with the layer indices summarized.
Findings are for one vLLM version (``--vllm-version``, default the one the serving plugin pins);
where another proven version reads the same config differently (a row of ``VERSION_TABLE``), the
findings say so.
"""

from __future__ import annotations

import re
from functools import lru_cache

from clef_format.records import Record

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Any, Iterable, Mapping

from clef_format.read.checkpoint import Checkpoint
from clef_format.spec import schemes
from clef_format.spec.findings import Finding, Severity
from clef_format.spec.model_spec import ModelConfig, linear_modules
from clef_format.verify.options import DEFAULTS, VerifyOptions
from clef_format.verify.vllm_build import VllmBuild, build_vllm
from clef_format.vllm_rules import matching as R
from clef_format.vllm_rules import names as vllm_names
from clef_format.vllm_rules.names import VllmLayer, VllmModel

CONFIG_FILE = "config.json"


class _Issue(Record):
    code: str
    severity: Severity
    template: str  # message with "{modules}" where the (summarized) module list goes
    module: str
    fix: str | None = None


def summarize(names: Iterable[str], limit: int = 6) -> str:
    """``a.layers.{0-3,7}.mlp.x, ...``: fold layer/block indices so 32 layers read as one line."""
    groups: dict[str, list[int]] = {}
    for n in names:
        m = re.search(r"\.(layers|blocks)\.(\d+)\.", n)
        if m:
            key = n[: m.start(2)] + "{}" + n[m.end(2):]
            groups.setdefault(key, []).append(int(m.group(2)))
        else:
            groups.setdefault(n, [])
    parts = []
    for key, idx in groups.items():
        parts.append(key.replace("{}", "{" + _ranges(sorted(set(idx))) + "}") if idx else key)
    more = f" (+{len(parts) - limit} more)" if len(parts) > limit else ""
    return ", ".join(parts[:limit]) + more


def _ranges(idx: list[int]) -> str:
    out: list[str] = []
    start = prev = idx[0]
    for i in [*idx[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(out)


def _fold(issues: list[_Issue]) -> list[Finding]:
    grouped: dict[tuple[str, Severity, str, str | None], list[str]] = {}
    for i in issues:
        grouped.setdefault((i.code, i.severity, i.template, i.fix), []).append(i.module)
    return [
        Finding(code, sev, template.format(modules=summarize(mods)), file=CONFIG_FILE, module=mods[0], fix=fix)
        for (code, sev, template, fix), mods in grouped.items()
    ]


# ----------------------------------------------------------------------------- which names a pattern hits


def _vllm_target_hits(model: VllmModel, target: str, first_only: bool = False) -> list[str]:
    """vLLM layers a (mapped) target can match: by name, by a shard name, or by class name."""
    hits = []
    match = R.name_matcher(target)
    for layer in model.layers:
        if match(layer.name) or any(map(match, _shard_names(layer, model))) \
                or R.equal_or_regex(layer.cls, target, contains=True):
            hits.append(layer.name)
            if first_only:
                break
    return hits


def _vllm_ignore_hits(model: VllmModel, entry: str, first_only: bool = False) -> list[str]:
    """vLLM layers an (mapped) ignore entry can affect: exact fused name, or a shard / plain name."""
    hits = []
    match = R.name_matcher(entry)
    for layer in model.layers:
        if entry == layer.name or any(map(match, _shard_names(layer, model))):
            hits.append(layer.name)
            if first_only:
                break
    return hits


def _shard_names(layer: VllmLayer, model: VllmModel) -> tuple[str, ...]:
    return _expand(layer.name, model.arch)


@lru_cache(maxsize=8192)
def _expand(name: str, arch: str) -> tuple[str, ...]:
    """Shard names of a layer (itself when unfused); cached: every pattern asks about every layer."""
    expanded = R.fused_shards(name, vllm_names.packed_for_arch(arch))
    return expanded[1] if expanded is not None else (name,)


def _hf_hits(model_cfg: ModelConfig, pattern: str, by_class: bool) -> list[str]:
    specs = [*linear_modules(model_cfg), vllm_names.lm_head_spec(model_cfg)]
    classes = vllm_names.HF_LINEAR_CLASSES if by_class else ()
    return [s.name for s in specs if R.ct_match(s.name, pattern, classes)]


def _expected_layers(model: VllmModel, hf_names: set[str]) -> set[str]:
    """vLLM layers all of whose HF shards the pattern hit (what the pattern was meant to cover)."""
    return {l.name for l in model.layers if all(s.name in hf_names for s in l.shards)}


def _fix_candidates(model: VllmModel, pattern: str, expected: set[str]) -> list[str]:
    """Rewrites of an HF-anchored pattern: the mapper's prefix swap, or a leading ``.*``."""
    if not pattern.startswith("re:"):
        return [next(iter(expected))] if len(expected) == 1 else []
    body = pattern[3:]
    out: list[str] = []
    for old, new in model.prefixes:
        if new is None:
            continue
        o, n = old.rstrip("."), new.rstrip(".")
        if body.startswith(re.escape(o)):
            out.append("re:" + re.escape(n) + body[len(re.escape(o)):])
        elif body.startswith(o):
            out.append("re:" + n + body[len(o):])
    out.append("re:.*" + body)
    return list(dict.fromkeys(out))


def _derive_fix(model: VllmModel, pattern: str, expected: set[str], as_ignore: bool) -> str | None:
    """A replacement pattern that hits exactly the vLLM layers the HF pattern covered, if one is found."""
    if not expected:
        return None
    for cand in _fix_candidates(model, pattern, expected):
        hits = _vllm_ignore_hits(model, cand) if as_ignore else _vllm_target_hits(model, cand)
        if set(hits) == expected:
            return cand
    return None


# ----------------------------------------------------------------------------- the check


def check_patterns(ck: Checkpoint, opts: VerifyOptions = DEFAULTS, vllm: VllmBuild | None = None) -> list[Finding]:
    """All pattern findings for a checkpoint (needs ``ck.config``, ``ck.model``, ``ck.backbone``), on the
    rules of vLLM ``opts.rules``; ``vllm``: the build of ``ck.model`` on that version, when already made."""
    model_cfg = ck.model
    if ck.config is None or model_cfg is None:
        return []
    version = opts.rules
    findings = pattern_findings(model_cfg, ck.backbone or {}, version, built=vllm)
    if not vllm_names.rules_for(version).proven:  # verify and layers alike: say what the answer rests on
        proven = ", ".join(vllm_names.PROVEN)
        findings.insert(0, Finding(
            "vllm-unproven", "info", f"the pattern rules for vLLM {version} are extrapolated from the version table "
            f"(vllm_rules/names.py VERSION_TABLE, read from each wheel's source), not proven against that vLLM: the "
            f"real-vLLM tiers prove {proven}", fix=f"a proven answer: --vllm-version {' or '.join(vllm_names.PROVEN)}; "
            f"the real-vLLM tier (docs/VLLM.md) run against vLLM {version} would prove its rules"))
    if model_cfg.quantization and not any(f.code == "quant-config-invalid" for f in findings):
        from clef_format.vllm_rules.config_rules import set_fix

        # vLLM serves these as stored (it ignores the status, and weights.dynamic for NVFP4; what it refuses is the
        # resolver's error above): a warning, since transformers and compressed-tensors' own loader cannot load them
        findings += [Finding("quant-config-invalid", "warning", f"{message}; vLLM serves the weights as stored",
                             file=CONFIG_FILE, fix=set_fix(key, value))
                     for key, message, value in schemes.quant_config_problems(model_cfg.quantization)]
    return findings


def pattern_findings(model_cfg: ModelConfig, backbone: dict[str, Any], version: str = vllm_names.DEFAULT_VLLM,
                     other_versions: Iterable[str] = vllm_names.PROVEN, built: VllmBuild | None = None) -> list[Finding]:
    """Findings for vLLM ``version`` (from ``built``, its build of ``model_cfg``, when given), plus what
    differs on each of ``other_versions``."""
    findings, in_play = _version_findings(model_cfg, backbone, built or build_vllm(model_cfg, version))
    for other in other_versions:
        rows = vllm_names.differing_rules(version, other)
        if rows and (in_play is None or any(r.name in in_play for r in rows)):
            theirs, _ = _version_findings(model_cfg, backbone, build_vllm(model_cfg, other))
            findings = _compare(findings, theirs, model_cfg, version, other, rows)
    return findings


def _compare(mine: list[Finding], theirs: list[Finding], model_cfg: ModelConfig, version: str, other: str,
             rows: list[vllm_names.VersionRule]) -> list[Finding]:
    """Mark findings that do not hold on vLLM ``other``; add, as warnings, those that hold only there."""
    key = lambda f: (f.code, f.message)  # noqa: E731
    have, there = {key(f) for f in mine}, {key(f) for f in theirs}
    if have == there:
        return mine
    why = _why(model_cfg, other, rows)
    out = [f if key(f) in there else f._replace(message=f"{f.message} [not on vLLM {other}: {why}]") for f in mine]
    for f in theirs:
        if key(f) not in have:
            out.append(f._replace(severity="warning" if f.severity == "error" else f.severity,
                                  message=f"on vLLM {other} (checked: {version}): {f.message} [{why}]"))
    return out


def _why(model_cfg: ModelConfig, other: str, rows: list[vllm_names.VersionRule]) -> str:
    """The version-table rows behind a difference, naming fused-name ignore entries where that rule applies."""
    qc = model_cfg.quantization or {}
    groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
    args = [(g.get("weights") or {}, g.get("input_activations") or {}) for g in groups]
    args = [(w, i) for w, i in args if isinstance(w, dict) and isinstance(i, dict)]
    parts = []
    for r in rows:
        when = f"from {r.since[0]}.{r.since[1]}"
        if r.name == "fused_name_ignore":
            model = vllm_names.build(model_cfg, other)
            hits = sorted({i for i in qc.get("ignore") or [] if isinstance(i, str)
                           for l in model.layers if l.fused and R.equal_or_regex(l.name, i)})
            if hits:
                parts.append(f"ignore {', '.join(repr(h) for h in hits)} matches the fused layer name itself, which "
                             f"{when} ignores the whole fused layer (before, each shard is checked and a partly "
                             "ignored fused layer raises ValueError)")
        elif r.name == "actorder_group_refused":
            if any(str(w.get("actorder")).lower() in ("true", "group", "dynamic") for w, _ in args):
                parts.append(f"{when}: {r.after}")
        elif any(w.get("num_bits") == 4 and i.get("num_bits") == 8 for w, i in args):  # W4A8 rows
            parts.append(f"{when}: {r.after}")
    return "; ".join(parts) or "; ".join(f"{r.name} (from {r.since[0]}.{r.since[1]})" for r in rows)


def _version_findings(model_cfg: ModelConfig, backbone: dict[str, Any],
                      built: VllmBuild) -> tuple[list[Finding], frozenset[str] | None]:
    """The findings on the vLLM ``built`` is for and the version-table rows in play (None: the config did not parse)."""
    model = built.model
    specs = [*linear_modules(model_cfg), vllm_names.lm_head_spec(model_cfg)]
    stored = R.stored_schemes(backbone, specs)
    if built.refused is not None:
        return [Finding("quant-config-invalid", "error", f"vLLM refuses quantization_config: {built.refused}",
                        file=CONFIG_FILE, fix="fix quantization_config so compressed-tensors' QuantizationConfig "
                        "accepts it")], None
    qc, vq = built.quant, built.vquant
    hf: Mapping[str, R.HfDecision] = R.resolve_hf(model_cfg, qc) if qc is not None else {}
    issues: list[_Issue] = []
    findings: list[Finding] = []
    if qc is not None and vq is not None:
        findings += _target_findings(model_cfg, model, qc, vq)
    for layer, d in zip(model.layers, built.decisions):
        issues += _layer_issues(layer, d, hf, stored)
        if vq is not None and d.error is None and d.target is not None:
            issues += _block_issues(layer, d, vq.targets[d.target])
    return findings + _fold(issues), built.in_play


def _block_issues(layer: VllmLayer, d: R.Decision, entry: R.Entry) -> list[_Issue]:
    """vLLM refuses to build a block-quantized merged layer whose partitions do not fit the block."""
    problem = R.block_problem(layer, entry, d.scheme)
    if problem is None:
        return []
    sizes = R.output_partitions(layer)
    names = ", ".join(s.name.rsplit(".", 1)[-1] for s in layer.shards)
    return [_Issue("quant-config-invalid", "error",
                   f"vLLM refuses to build {{modules}} (ValueError: {problem}): group '{entry.group}' quantizes "
                   f"{names} in blocks of {entry.weights.raw.get('block_structure')}, and its output partitions "
                   f"{sizes} (all but the last) must be multiples of the block's rows", layer.name,
                   f"keep {names} out of the block group (e.g. an FP8_DYNAMIC group for them, or ignore them), "
                   "or use a block whose rows divide every partition")]


def _target_findings(model_cfg: ModelConfig, model: VllmModel, qc: R.QuantConfig, vq: R.VllmQuant) -> list[Finding]:
    out: list[Finding] = []
    class_only = set(R.class_only_targets(model_cfg, qc))
    for target in qc.targets:
        mapped = vq.mapped_from.get(target)
        if mapped is not None and _vllm_target_hits(model, mapped, first_only=True):
            if target in class_only:
                out.append(_class_name_finding(model, target, mapped))
            continue
        hf_names = _hf_hits(model_cfg, target, by_class=True)
        if mapped is None:
            out.append(Finding("pattern-unmatched", "warning", f"target '{target}' is dropped by vLLM's name mapper",
                               file=CONFIG_FILE, fix=None))
        elif hf_names:
            expected = _expected_layers(model, set(hf_names))
            fix = _derive_fix(model, target, expected, as_ignore=False)
            out.append(Finding(
                "pattern-hf-anchored", "error",
                f"target '{target}' matches Hugging Face modules ({summarize(hf_names)}) but no vLLM layer; "
                "vLLM matches its own names (re: patterns with re.match, anchored at the start)",
                file=CONFIG_FILE, module=hf_names[0],
                fix=f"use '{fix}' instead of '{target}'" if fix else "rewrite the target against vLLM's layer names "
                "(`clef-format layers PATH` lists them)"))
        else:
            out.append(Finding("pattern-unmatched", "warning", f"target '{target}' matches no vLLM layer (nor any HF module)",
                               file=CONFIG_FILE, fix=f"remove '{target}' or correct it"))
    for entry in qc.ignore:
        mapped = vq.mapped_from.get(entry)
        if mapped is not None and _vllm_ignore_hits(model, mapped, first_only=True):
            continue
        hf_names = _hf_hits(model_cfg, entry, by_class=False)
        if hf_names:
            expected = _expected_layers(model, set(hf_names))
            fix = _derive_fix(model, entry, expected, as_ignore=True)
            if fix is not None and not _changes(model, vq, entry, fix):
                continue  # e.g. "lm_head" with targets that never reach vLLM's lm_head: harmless
            out.append(Finding(
                "ignore-unmatched", "warning",
                f"ignore entry '{entry}' matches Hugging Face modules ({summarize(hf_names)}) but no vLLM layer, "
                "so vLLM does not ignore them",
                file=CONFIG_FILE, module=hf_names[0],
                fix=f"use '{fix}' instead of '{entry}'" if fix else None))
        else:
            out.append(Finding("ignore-unmatched", "info", f"ignore entry '{entry}' matches no layer (HF or vLLM)",
                               file=CONFIG_FILE, fix=f"remove '{entry}' or correct it"))
    return out


def _class_name_finding(model: VllmModel, target: str, mapped: str) -> Finding:
    """A target vLLM matches only against its layers' class names (``re:.*Linear``, ``linear``): vLLM
    builds those layers quantized, but compressed-tensors' quantizer (and transformers loading through it)
    matches a class name only when it equals the class (``Linear``) and ``re:`` only against module names,
    so for it the target matches nothing. The fix is the class name both read alike, when it hits the
    same vLLM layers."""
    hits = _vllm_target_hits(model, mapped)
    classes = sorted({l.cls for l in model.layers if l.name in set(hits)})
    fixed = next((c for c in vllm_names.HF_LINEAR_CLASSES if set(_vllm_target_hits(model, c)) == set(hits)), None)
    return Finding(
        "pattern-class-name", "warning",
        f"target '{target}' matches vLLM layers only by their class name ({', '.join(classes)}: {summarize(hits)}), "
        "and vLLM quantizes those it does not ignore; compressed-tensors matches a class name only when it is exactly "
        "the module's class and a re: pattern only against module names, so for the quantizer and transformers this "
        "target matches no module (transformers would load these layers unquantized)",
        file=CONFIG_FILE, module=hits[0],
        fix=f"use '{fixed}' instead of '{target}'" if fixed else "rewrite the target against module names "
        "(`clef-format layers PATH` lists vLLM's)")


def _changes(model: VllmModel, vq: R.VllmQuant, entry: str, fix: str) -> bool:
    """Whether ignoring ``fix`` instead of ``entry`` changes what vLLM builds (else the slip is harmless)."""
    mapped = vq.mapped_from.get(entry, entry)
    fixed = R.VllmQuant(vq.targets, tuple(fix if i == mapped else i for i in vq.ignore), vq.format, vq.mapped_from)
    def built(q: R.VllmQuant, layer: VllmLayer) -> tuple[str | None, str | None]:
        d = R.resolve_layer(layer, q, model)
        return d.scheme, d.error

    touched = set(_vllm_ignore_hits(model, fix))  # only these layers can change
    return any(built(vq, l) != built(fixed, l) for l in model.layers if l.name in touched)


def _label(h: R.HfDecision | None) -> str:
    if h is None or h.scheme is None:
        return "ignored (BF16)" if h is not None and h.ignored else "unquantized (BF16)"
    return f"{h.scheme} via '{h.target}'"


def _layer_issues(layer: VllmLayer, d: R.Decision, hf: Mapping[str, R.HfDecision],
                  stored: dict[str, str | None]) -> list[_Issue]:
    out: list[_Issue] = []
    shard_hf = [hf.get(s.name) for s in layer.shards]
    if d.error is not None:
        if "different quantization schemes" in d.error:
            names = ", ".join(s.name.rsplit(".", 1)[-1] for s in layer.shards)
            return [_Issue("fused-scheme-mismatch", "error",
                           f"vLLM refuses to build {{modules}}: its shards ({names}) are partly ignored "
                           f"(ValueError: vLLM requires all to use the same scheme)", layer.name,
                           f"ignore all of {names} or none of them (anchor regexes with $)")]
        return [_Issue("quant-config-invalid", "error", f"vLLM cannot build a scheme for {{modules}}: {d.error_kind}: "
                       + d.error.split(" for layer_name")[0], layer.name,
                       "use a scheme vLLM supports (FP8_DYNAMIC, NVFP4) for these modules")]
    if len(layer.shards) > 1:
        schemes_seen = {(h.scheme if h else None) for h in shard_hf}
        if len(schemes_seen) > 1:
            detail = "; ".join(f"{s.name.rsplit('.', 1)[-1]}: {_label(h)}" for s, h in zip(layer.shards, shard_hf))
            out.append(_Issue("fused-scheme-mismatch", "error",
                              f"{{modules}}: vLLM fuses shards the quantizer treated differently ({detail}); "
                              f"vLLM builds one scheme for all: {d.scheme}", layer.name,
                              "give all shards of a fused layer one config group (or ignore them together)"))
    stored_here = [(s.name, stored.get(s.name)) for s in layer.shards if stored.get(s.name) is not None]
    quant_stored = [(n, sc) for n, sc in stored_here if sc != schemes.UNQUANTIZED]
    via = f" (target '{d.target}')" if d.target else (" (ignored)" if d.ignored else " (no target matches)")
    if d.scheme == schemes.UNQUANTIZED and quant_stored:
        kinds = ", ".join(sorted({R.layout_label(sc) for _, sc in quant_stored if sc}))
        out.append(_Issue("layer-unquantized", "error",
                          f"{{modules}}: stored {kinds} but vLLM builds it unquantized{via}; loading fails or serves garbage",
                          layer.name, _unquantized_fix(layer, shard_hf)))
        return out
    mismatched = [(n, sc) for n, sc in stored_here if not R.layout_fits(sc, d.scheme)]
    if mismatched:
        kinds = ", ".join(sorted({R.layout_label(sc) for _, sc in mismatched if sc}))
        out.append(_Issue("scheme-tensor-mismatch", "error",
                          f"{{modules}}: vLLM builds {d.scheme}{via} but the stored tensors are {kinds}",
                          layer.name, "make the config's targets match what the export wrote (see `clef-format layers`)"))
        return out
    meant = [h for h in shard_hf if h is not None and h.scheme is not None]
    if d.scheme == schemes.UNQUANTIZED and meant and not quant_stored:
        out.append(_Issue("layer-unquantized", "warning",
                          f"{{modules}}: the recipe quantizes it ({_label(meant[0])}) but vLLM builds it unquantized{via}",
                          layer.name, _unquantized_fix(layer, shard_hf)))
    return out


def _unquantized_fix(layer: VllmLayer, shard_hf: list[R.HfDecision | None]) -> str:
    targets = {h.target for h in shard_hf if h is not None and h.target}
    if targets:
        return f"make {', '.join(sorted(targets))} match vLLM's name {_kind(layer.name)}"
    return "add a target matching this layer in vLLM's names, or store it in BF16"


def _kind(name: str) -> str:
    return re.sub(r"\.(layers|blocks)\.\d+\.", r".\1.N.", name)
