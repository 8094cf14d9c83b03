"""vLLM's module names and its compressed-tensors matching, re-implemented per vLLM version
(pure: no vllm import). The real-vLLM tiers (tests/tier_vllm) prove them against vLLM itself."""
