"""Checkpoint -> report: the checks, deep verification and the per-layer view. Reads only."""

from clef_format.verify.run import open_checkpoint, verify, verify_checkpoint

__all__ = ["open_checkpoint", "verify", "verify_checkpoint"]
