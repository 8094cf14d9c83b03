"""The docs match the code: every finding code and every command is documented in the README, and the
README's proven vLLM versions are docs/VLLM.md's."""

from __future__ import annotations

from pathlib import Path

from clef_format.cli.commands import COMMANDS
from clef_format.spec.findings import CODES

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_every_finding_code_is_in_the_readme():
    missing = [code for code in CODES if f"`{code}`" not in README]
    assert not missing, f"README lacks finding codes {missing}"


def test_every_command_is_in_the_readme():
    missing = [name for name in COMMANDS if f"clef-format {name}" not in README]
    assert not missing, f"README lacks commands {missing}"


def test_readme_code_table_is_the_code_table():
    rows = [line for line in README.splitlines() if line.startswith("| `") and line.count("|") == 3]
    documented = {line.split("`")[1]: line.split("|")[2].strip() for line in rows}
    assert {c: documented.get(c) for c in CODES} == CODES


VLLM_MD = (Path(__file__).resolve().parents[2] / "docs" / "VLLM.md").read_text()


def _rows(text: str, header: str) -> list[list[str]]:
    """The cells of the markdown table that follows ``header``."""
    lines = text[text.index(header):].splitlines()[1:]
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def test_readme_proven_vllm_versions_are_docs_vllm_md_s():
    """Per minor version, the README's proven statements are docs/VLLM.md's: the same versions proven (the
    code's PROVEN), the same not proven, and every count the README quotes is VLLM.md's for that version."""
    import re

    from clef_format.vllm_rules.names import PROVEN

    readme = {r[0].split(" ")[0]: r for r in _rows(README, "**Proven vLLM versions**")}
    vllm_md = {r[0].strip("*").split(" ")[0]: r for r in _rows(VLLM_MD, "## Proven versions")}
    proven = sorted(v for v, r in readme.items() if r[1] == "**proven**")
    assert proven == sorted(".".join(v.split(".")[:2]) for v, r in vllm_md.items() if r[1] == "**proven**") \
        == sorted(PROVEN)
    assert "0.29" in readme and "0.29" in vllm_md and "proven" not in readme["0.29"][1].replace("not proven", "")
    counts_at = VLLM_MD.index("### Counts per version")
    header = next(line for line in VLLM_MD[counts_at:].splitlines() if line.startswith("|"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    counts = _rows(VLLM_MD, "### Counts per version")
    for minor in proven:
        col = columns.index(f"vLLM {minor}.0")
        cells = " ".join(r[col] for r in counts)
        quoted = re.findall(r"\d{1,3}(?:,\d{3})+|\b\d{3}\b", readme[minor][2])
        assert quoted and all(n in cells for n in quoted), (minor, quoted, cells)
