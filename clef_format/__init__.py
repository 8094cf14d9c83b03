"""clef-format: keep quantized Clef checkpoints and their vLLM serving plugin honest.

Import what you need from the submodules; this package imports nothing heavy by itself
(reading a checkpoint's structure never imports torch).
"""

__version__ = "0.1.0"
