"""Write the producer tier's table into docs/VLLM.md from the rows the tier's runs wrote.

    python scripts/producer_table.py [build/producer-0.28.json build/producer-0.33.json]

Each scripts/test-producer.sh run writes build/producer-<version>.json (tests/tier_producer); this
puts one row per output between the ``producer-table`` markers of docs/VLLM.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "VLLM.md"
START, END = "<!-- producer-table:start -->", "<!-- producer-table:end -->"


def cell(row: dict | None, key: str) -> str:
    if row is None:
        return "not run"
    if not row.get("produced", True):
        return "not produced"
    value = row.get(key)
    return "-" if value is None else str(value)


def agree(row: dict | None) -> str:
    if row is None or not row.get("produced", True) or "tool" not in row:
        return "-"
    verdict = "yes" if row["tool"] == row["vllm"] else "**no**"
    layers = {True: "yes", False: "**no**", None: "-"}[row.get("layers_agree")]
    migrate = {True: "ok", False: "**failed**", None: "-"}[row.get("migrate")]
    return f"{verdict} / {layers} / {migrate}"


def short(text: str, limit: int = 170) -> str:
    """vLLM's message without its logger's module path, cut to a table cell."""
    text = text.replace("vllm.model_executor.layers.quantization.compressed_tensors.schemes.", "")
    return text if len(text) <= limit else text[:limit - 3] + "..."


def tool_errors(row: dict | None) -> str:
    """The tool's error codes after its verdict, if it had any."""
    return " " + ", ".join(sorted(set(row.get("tool_errors") or []))) if row and row.get("tool_errors") else ""


def table(reports: list[dict]) -> str:
    names = sorted({n for r in reports for n in r["rows"]})
    head = "| output | " + " | ".join(f"clef-format ({r['vllm']}) | vLLM {r['vllm']} | verdict / layers / migrate"
                                      for r in reports)
    lines = [head + " | what vLLM did |", "|" + " --- |" * (1 + 3 * len(reports) + 1)]
    for n in names:
        rows = [r["rows"].get(n) for r in reports]
        cells = [f"{cell(row, 'tool')}{tool_errors(row)} | {cell(row, 'vllm')} | {agree(row)}" for row in rows]
        says = {r["vllm"]: short(row.get("vllm_says") or row.get("note", "")) for r, row in zip(reports, rows) if row}
        said = next(iter(says.values())) if len(set(says.values())) == 1 else "; ".join(f"{v}: {t}" for v, t in says.items())
        lines.append(f"| {n} | " + " | ".join(cells) + f" | {said.replace('|', '/')} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    paths = [Path(p) for p in argv] or [ROOT / "build" / f"producer-{v}.json" for v in ("0.28", "0.33")]
    reports = [json.loads(p.read_text()) for p in paths if p.exists()]
    if not reports:
        print("producer_table: no reports; run scripts/test-producer.sh first", file=sys.stderr)
        return 2
    text = DOC.read_text()
    before, _, rest = text.partition(START)
    _, _, after = rest.partition(END)
    DOC.write_text(before + START + "\n" + table(reports) + "\n" + END + after)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
