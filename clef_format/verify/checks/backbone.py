"""Backbone checks: every tensor the config implies is stored, with the right dtype and shape, and no other."""

from __future__ import annotations

TYPE_CHECKING = False  # typing is imported only by type checkers: it is slow to import
if TYPE_CHECKING:
    from typing import Iterator

from clef_format.read.checkpoint import Checkpoint
from clef_format.spec.findings import Finding, error
from clef_format.spec.layouts import Layout
from clef_format.spec.model_spec import linear_modules, plain_params, table_shape
from clef_format.spec.schemes import FLOAT_DTYPES, params_by_module, scheme_problems, stored_scheme

_REDOWNLOAD = "re-download the backbone; if it was produced locally, re-run the export"


def check_backbone(ck: Checkpoint) -> Iterator[Finding]:
    if ck.model is None or not ck.backbone:
        return
    accounted: set[str] = set()
    params = params_by_module(ck.backbone, (m.name for m in linear_modules(ck.model)))
    for spec in linear_modules(ck.model):
        stored = params[spec.name]
        accounted.update(f"{spec.name}.{s}" for s in stored)
        scheme = stored_scheme(stored)
        if scheme is None:
            yield error("tensor-missing", f"{spec.name}: no weight stored (neither weight nor weight_packed)",
                        module=spec.name, tensor=f"{spec.name}.weight", file=None, fix=_REDOWNLOAD)
            continue
        for problem in scheme_problems(scheme, stored, spec.out_features, spec.in_features):
            code = "tensor-missing" if problem.startswith("missing ") else "tensor-shape"
            yield error(code, f"{spec.name} ({scheme}): {problem}", module=spec.name, fix=_REDOWNLOAD)
    for name, shape in plain_params(ck.model).items():
        info = ck.backbone.get(name)
        if info is None:
            yield error("tensor-missing", f"{name} is missing", tensor=name, fix=_REDOWNLOAD)
            continue
        accounted.add(name)
        if info.shape != shape:
            yield error("tensor-shape", f"{name} has shape {list(info.shape)}, config implies {list(shape)}",
                        tensor=name, file=ck.tensor_file.get(name), fix=_REDOWNLOAD)
    vocab_hidden = table_shape(ck.model)
    for table in ck.tables:
        info = ck.backbone.get(table)
        if info is None:
            continue
        accounted.add(table)
        if ck.layout in (Layout.LAYOUT_2, Layout.LAYOUT_2_UNMARKED):
            continue  # reported as tables-duplicated by the layout check
        if info.dtype not in FLOAT_DTYPES or info.shape != vocab_hidden:
            yield error("table-shape", f"{table} is {info.dtype}{list(info.shape)}, expected BF16{list(vocab_hidden)}",
                        tensor=table, file=ck.tensor_file.get(table), fix=_REDOWNLOAD)
    for name in sorted(set(ck.backbone) - accounted):
        yield error("tensor-unexpected", f"{name} is not part of a {ck.model.architecture} with this config",
                    tensor=name, file=ck.tensor_file.get(name),
                    fix="check that config.json belongs to these weights; re-download both from one revision")
