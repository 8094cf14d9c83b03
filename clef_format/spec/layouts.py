"""The split-layout model: file names, layout names, and how a layout is told from the files.

One source of truth for where things live in a Clef checkpoint (docs/FORMAT.md, "Layouts").
"""

from __future__ import annotations

from enum import Enum

from clef_format.records import Record


class Layout(str, Enum):
    ORIGINAL_RELEASE = "original-release"
    LAYOUT_1 = "layout-1"
    LAYOUT_2 = "layout-2"
    LAYOUT_2_UNMARKED = "layout-2-unmarked"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


CONFIG = "config.json"
BACKBONE_SINGLE = "model.safetensors"
BACKBONE_INDEX = "model.safetensors.index.json"
HEAD_DIR = "clef_head"
HEAD_WEIGHTS = f"{HEAD_DIR}/joint_head.safetensors"
HEAD_CONFIG = f"{HEAD_DIR}/joint_head_config.json"
TABLES = f"{HEAD_DIR}/tables_int8.safetensors"
HEAD_CODE = "joint_schema_model.py"
#: The folder a release ships its serving plugin in (``pip install ./<repo>/vllm_plugin``).
PLUGIN_DIR = "vllm_plugin"
RELEASE_HEAD_WEIGHTS = "joint_head.safetensors"
RELEASE_HEAD_CONFIG = "joint_head_config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

#: The key of the version marker inside the joint head config.
MARKER_KEY = "requires_clef_vllm"
#: What migrate writes as the marker.
MARKER_VALUE = ">=0.2.0"

#: The HF names of the two big tables (embedding lookup and lexical rows).
EMBED_TOKENS = "model.language_model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
TABLE_NAMES = (EMBED_TOKENS, LM_HEAD)


class LayoutFacts(Record):
    """What layout detection needs, read from file names and headers only."""

    has_backbone: bool
    has_release_head: bool
    has_clef_head: bool
    tables_in_backbone: bool
    has_tables_file: bool
    #: ``None`` when the head config is there but its content was never read (not valid JSON, empty, a
    #: directory in its place): whether it holds a marker is then not known, and no layout is asserted.
    has_marker: bool | None


def detect_layout(facts: LayoutFacts) -> Layout:
    """Name the layout of a checkpoint. A marker always means layout 2 (its tables are then checked)."""
    if not facts.has_backbone:
        return Layout.UNKNOWN
    if facts.has_clef_head or facts.has_tables_file:
        if facts.has_marker is None:  # the marker decides between the clef_head layouts: never guessed
            return Layout.UNKNOWN
        if facts.has_marker:
            return Layout.LAYOUT_2
        if facts.has_tables_file:
            return Layout.LAYOUT_2_UNMARKED
        if facts.tables_in_backbone:
            return Layout.LAYOUT_1
        return Layout.UNKNOWN
    if facts.has_release_head and facts.tables_in_backbone:
        return Layout.ORIGINAL_RELEASE
    return Layout.UNKNOWN


def vllm_globs(rel: str) -> bool:
    """Whether vLLM loads the file at checkpoint-relative path ``rel`` as weights: its DefaultModelLoader
    takes ``glob.glob(os.path.join(folder, "*.safetensors"))``, so a top-level name ending in
    ``.safetensors`` (case-sensitive) that does not start with a dot (glob skips hidden names).

    With an index, vLLM keeps the globbed files whose path *string* equals ``os.path.join(folder,
    value)`` for some ``weight_map`` value and raises (FileNotFoundError, "Weight files referenced in
    index but missing") for any other value, so a value vLLM accepts is exactly a name this returns
    True for (``./x``, ``sub/../x``, ``sub/x`` never match). vLLM 0.28.0 and 0.33.0 alike
    (``filter_duplicate_safetensors_files``)."""
    return "/" not in rel and not rel.startswith(".") and rel.endswith(".safetensors")


#: Files at the top level or in ``clef_head/`` that no loader opens: documentation, repository housekeeping
#: and the producer's recipe. Every other file there may be read when an engine starts (see ``read_at_start``).
NOT_READ_NAMES = frozenset({".gitattributes", ".gitignore", "recipe.yaml"})
NOT_READ_PREFIXES = ("README", "LICENSE", "NOTICE", "CHANGELOG")
NOT_READ_SUFFIXES = (".md", ".png", ".jpg", ".jpeg", ".gif", ".svg", ".webp")


def read_at_start(rel: str) -> bool:
    """Whether vLLM or the clef-vllm plugin may read checkpoint-relative path ``rel`` when an engine starts:
    what the serving gate hashes against the download's references.

    vLLM globs the top-level ``*.safetensors`` (``vllm_globs``) and reads the index; transformers' config,
    tokenizer, processor and generation-config loaders open top-level files by name (``config.json``,
    ``tokenizer*.json``, ``vocab.json``, ``merges.txt``, ``chat_template.jinja``, ``*processor_config.json``,
    ``generation_config.json`` ...), a list that grows with transformers; the plugin reads ``clef_head/`` and
    ``joint_schema_model.py``. So every file at the top level or in ``clef_head/`` counts, except the few no
    loader opens (``NOT_READ_*``): a file wrongly counted costs a refused start on a file that did not
    matter (the fix is the same re-download), a file wrongly left out would be served unchecked. Other
    folders (a release's ``vllm_plugin/``, ``scripts/``) are never read by the engine.
    """
    parts = rel.split("/")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != HEAD_DIR):
        return False
    name = parts[-1]
    return not (name in NOT_READ_NAMES or name.startswith(NOT_READ_PREFIXES) or name.lower().endswith(NOT_READ_SUFFIXES))


def required_files(layout: Layout) -> tuple[str, ...]:
    """Files a layout cannot work without (the backbone is checked separately: single or sharded)."""
    if layout is Layout.ORIGINAL_RELEASE:
        return (CONFIG, RELEASE_HEAD_WEIGHTS, RELEASE_HEAD_CONFIG)
    if layout is Layout.LAYOUT_1:
        return (CONFIG, HEAD_WEIGHTS, HEAD_CONFIG, HEAD_CODE)
    if layout in (Layout.LAYOUT_2, Layout.LAYOUT_2_UNMARKED):
        return (CONFIG, HEAD_WEIGHTS, HEAD_CONFIG, HEAD_CODE, TABLES)
    return (CONFIG,)


def migrate_command(path: str, to: str, snapshot: bool = False) -> str:
    """The command that moves ``path`` to layout ``to`` (a cache snapshot is never written: ``--output``),
    ``path`` quoted for the shell (``shell.quote_path``)."""
    from clef_format.shell import quote_path

    out = " --output DIR" if snapshot else ""
    return f"clef-format migrate {quote_path(path)} --to {to}{out}"


def head_files(layout: Layout) -> tuple[str, str]:
    """(weights, config) of the joint head for a layout."""
    if layout is Layout.ORIGINAL_RELEASE:
        return RELEASE_HEAD_WEIGHTS, RELEASE_HEAD_CONFIG
    return HEAD_WEIGHTS, HEAD_CONFIG
