"""Coverage-guided fuzzing (atheris / libFuzzer) of the header reader and the config readers.

    python tests/scenarios/fuzz_atheris.py -max_total_time=30 [-seed=N]

One input drives one reader, picked by its first byte: ``parse_header`` (with the file size taken
from the input), the JSON config path (``json.loads`` then ``parse_config``, ``parse_head_config``,
``parse_marker``), as ``read_checkpoint`` uses them. Any exception other than the reader's own
error type is a crash: libFuzzer stops and writes the input to ``crash-*``.
"""

from __future__ import annotations

import json
import sys

import atheris

with atheris.instrument_imports():
    from clef_format.read.safetensors import HeaderError, parse_header
    from clef_format.spec.joint_head import HeadConfigError, parse_head_config
    from clef_format.spec.marker import MarkerError, parse_marker
    from clef_format.spec.model_spec import ConfigError, parse_config


def one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    which, body = data[0] % 4, data[1:]
    if which == 0:
        size = int.from_bytes(body[:4], "little") + len(body)
        try:
            parse_header(body[4:], size)
        except HeaderError:
            pass
        return
    try:
        value = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return
    try:
        if which == 1:
            parse_config(value)
        elif which == 2:
            parse_head_config(value)
        else:
            parse_marker(value if not isinstance(value, dict) else value.get("requires_clef_vllm"))
    except (ConfigError, HeadConfigError, MarkerError):
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
