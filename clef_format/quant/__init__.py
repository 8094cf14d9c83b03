"""Int8 table arithmetic: per-row absmax quantization, decoding and the quality figures."""
