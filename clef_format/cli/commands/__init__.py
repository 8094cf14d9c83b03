"""One module per CLI command: ``add_arguments(parser)`` and ``run(args) -> exit status``; and their registry.

The registry lives here, below both of its readers (``cli.main`` picks the command from argv before
anything else loads; ``cli.parser`` builds the subcommands), as pip keeps ``commands_dict`` in
``pip._internal.commands``. Plain data, no imports: ``cli.main`` loads it before it runs.
"""

#: Subcommand -> (module under clef_format.cli.commands, one-line help).
COMMANDS: dict[str, tuple[str, str]] = {
    "verify": ("verify_cmd", "verify a checkpoint (directory or cached repo id)"),
    "migrate": ("migrate_cmd", "migrate a checkpoint to another layout, losing nothing"),
    "layers": ("layers_cmd", "per-layer schemes vLLM will build, and GPU memory"),
    "manifest": ("manifest_cmd", "write a hash manifest for fast offline --deep verification"),
    "example": ("example_cmd", "build a small example checkpoint and verify it"),
    "scan": ("scan_cmd", "every Clef copy on this machine (the HF cache, or folders): state, plugin, fix"),
    "codes": ("codes_cmd", "list every finding code and what it means"),
}

#: The commands that write nothing. Only these skip the interpreter's exit collection (``cli.main``): a
#: command that writes files finishes them before it reports, and keeps CPython's exit as it is anyway.
READ_ONLY: frozenset[str] = frozenset({"verify", "layers", "scan", "codes"})
