"""Bytes to records, no policy: safetensors headers, the checkpoint reader, the Hugging Face cache,
the hash manifest and hashing. Nothing here writes, and nothing here imports torch."""
