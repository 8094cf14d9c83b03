"""A process that runs real ``vllm.LLM`` engines, one at a time, for the engine tier's tests.

Started by ``engines.EngineHost`` as ``python engine_host.py`` with the plugin (or none) on
PYTHONPATH, so the plugin version is decided by what is installed, as on a server. It reads one
JSON request per line on stdin and writes one JSON reply per line on the pipe it was given as
``--reply-fd``; everything vLLM prints (this process, its engine core and worker processes) goes
to stderr, which the test side keeps in a log file and quotes when an engine refuses to start.

Requests: ``start`` (model, engine kwargs) -> ``generate`` / ``encode`` / ``apply`` -> ``stop``;
``exit``. Engines spawn processes: everything runs under ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib
import json
import os
import sys
import time
import traceback
from typing import Any


def _prompts(token_lists: list[list[int]]) -> list[Any]:
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=ids) for ids in token_lists]


class Host:
    def __init__(self) -> None:
        self.llm: Any = None

    def start(self, model: str, kwargs: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
        """``LLM(model, **kwargs)``; ``env``: variables set for this start only (the processes it spawns see them)."""
        from vllm import LLM

        if self.llm is not None:
            self.stop()
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        t0 = time.perf_counter()
        try:
            self.llm = LLM(model=model, **kwargs)
        except BaseException as exc:  # noqa: BLE001  (what the user of LLM() sees)
            traceback.print_exc()
            gc.collect()
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}", "start_s": time.perf_counter() - t0}
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return {"ok": True, "start_s": time.perf_counter() - t0}

    def stop(self) -> dict[str, Any]:
        if self.llm is not None:
            t0 = time.perf_counter()
            self.llm.llm_engine.engine_core.shutdown()
            self.llm = None
            gc.collect()
            return {"ok": True, "stop_s": time.perf_counter() - t0}
        return {"ok": True}

    def generate(self, prompts: list[list[int]], logprobs: int, max_tokens: int) -> dict[str, Any]:
        """Greedy generation with the top ``logprobs`` log-probs at every prompt and output position."""
        from vllm import SamplingParams

        sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, logprobs=logprobs, prompt_logprobs=logprobs,
                            detokenize=False)
        outs = self.llm.generate(_prompts(prompts), sp, use_tqdm=False)

        def table(entries: Any) -> list[dict[str, float] | None]:
            return [None if e is None else {str(t): float(lp.logprob) for t, lp in e.items()} for e in entries]

        return {"ok": True, "results": [
            {"prompt_logprobs": table(o.prompt_logprobs), "tokens": list(o.outputs[0].token_ids),
             "logprobs": table(o.outputs[0].logprobs)} for o in outs]}

    def encode(self, prompts: list[list[int]], out: str) -> dict[str, Any]:
        """Per-token hidden states (pooling runner, ``token_embed`` without normalisation) saved to ``out``."""
        import torch
        from vllm import PoolingParams

        outs = self.llm.encode(_prompts(prompts), PoolingParams(use_activation=False), pooling_task="token_embed",
                               use_tqdm=False)
        torch.save([o.outputs.data.clone() for o in outs], out)
        return {"ok": True, "out": out}

    def apply(self, func: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        """``llm.apply_model(module:function(model, **kwargs))`` in every worker: what the worker's model holds."""
        mod, _, name = func.partition(":")
        fn = functools.partial(getattr(importlib.import_module(mod), name), **kwargs)
        return {"ok": True, "results": self.llm.apply_model(fn)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reply-fd", type=int, required=True)
    fd = parser.parse_args().reply_fd
    replies = os.fdopen(fd, "w", buffering=1)
    os.dup2(2, 1)  # vLLM's own prints and those of its children go to the log, not the reply pipe
    sys.stdout = sys.stderr
    host = Host()
    replies.write(json.dumps({"ok": True, "ready": True}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        op = req.pop("op")
        print(f"==== engine_host: {op} {json.dumps(req)[:300]}", file=sys.stderr, flush=True)
        try:
            if op == "exit":
                host.stop()
                replies.write(json.dumps({"ok": True}) + "\n")
                break
            reply = getattr(host, op)(**req)
        except Exception as exc:  # noqa: BLE001
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
    replies.close()


if __name__ == "__main__":
    main()
