"""The joint head check (verify/checks/head.py): a config JointSchemaHead(**config) cannot take is one
head-incomplete error on that file, in each layout's place for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clef_format.read.checkpoint import read_checkpoint
from clef_format.spec import layouts as L
from clef_format.verify.checks.head import check_head


def _drop_key(path: Path, key: str) -> None:
    config = json.loads(path.read_text())
    del config[key]
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("layout, config_rel", [("layout-2", L.HEAD_CONFIG),
                                                ("original-release", L.RELEASE_HEAD_CONFIG)])
def test_a_head_config_lacking_a_key_is_one_error_on_that_file(fresh, layout: str, config_rel: str) -> None:
    root = fresh(layout)
    _drop_key(root / config_rel, "heads")
    (finding,) = check_head(read_checkpoint(root))
    assert finding.to_dict() == {"code": "head-incomplete", "severity": "error",
                                 "message": "joint head config lacks heads", "file": config_rel,
                                 "fix": "re-download the joint head files of this revision"}


def test_a_missing_head_config_is_left_to_the_layout_check(fresh) -> None:
    root = fresh("layout-2")
    (root / L.HEAD_CONFIG).unlink()
    assert list(check_head(read_checkpoint(root))) == []


def test_keys_the_head_does_not_accept_are_named_with_their_removal(fresh) -> None:
    root = fresh("layout-2")
    path = root / L.HEAD_CONFIG
    config = json.loads(path.read_text())
    config["dropout"] = 0.1
    path.write_text(json.dumps(config))
    (finding,) = check_head(read_checkpoint(root))
    assert finding.to_dict() == {
        "code": "head-unexpected", "severity": "error",
        "message": f"{L.HEAD_CONFIG} has keys ['dropout'] that JointSchemaHead(**config) does not accept",
        "file": L.HEAD_CONFIG, "fix": f"remove ['dropout'] from {L.HEAD_CONFIG}"}


def test_a_head_config_that_is_not_json_is_left_to_the_reader(fresh) -> None:
    """The reader reports bad-config and keeps no config; the head check adds nothing on top."""
    root = fresh("layout-2")
    (root / L.HEAD_CONFIG).write_text("{not json")
    ck = read_checkpoint(root)
    assert ck.head_config is None and "bad-config" in {f.code for f in ck.findings}
    assert list(check_head(ck)) == []
