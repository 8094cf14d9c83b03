"""Helpers the tests share (no tests here): the torch reference quantizer, torch tensor views, broken
and hostile checkpoints, fake Hugging Face caches, the migrate CLI runners. Never shipped in the wheel."""
