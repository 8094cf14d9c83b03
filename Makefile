# The two commands of the README. Each sets up what it needs (idempotent), then runs.
.PHONY: setup example test test-main test-vllm bench-verify

VENV := .venv
EXAMPLE_DIR ?= build/example

setup:
	bash scripts/bootstrap.sh

# Build a tiny layout-2 Hybrid checkpoint in the real formats (no download) and verify it.
example: setup
	rm -rf $(EXAMPLE_DIR)
	$(VENV)/bin/clef-format example $(EXAMPLE_DIR)

# All tests: the main tier, then the real-vLLM tier in its own (cached) environment.
test: test-main test-vllm

test-main: setup
	$(VENV)/bin/python -m pytest -q -n 2 -p no:cacheprovider tests --ignore=tests/vllm

test-vllm: setup
	bash scripts/test-vllm.sh

bench-verify: setup
	$(VENV)/bin/python benchmarks/bench_verify.py
