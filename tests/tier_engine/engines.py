"""Real vLLM engines for the tests: host processes, one live engine at a time, shared per configuration.

An ``EngineHost`` is one ``engine_host.py`` process per plugin setting (none, or one installed
plugin version): the plugin is found by vLLM exactly as on a server, through its entry point on
the path. ``Engines`` hands out engines by configuration key: each configuration is started once
per test session and kept until another one is needed (only one engine runs at a time on the
2-core machine); a refusal at start-up is kept too, with the log the user would have seen.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
HOST = HERE / "engine_host.py"
EXAMPLE = REPO / "examples" / "clef-vllm"
REPLY_TIMEOUT_S = 900.0

#: the two plugin generations the tier installs (pip, each into its own folder)
NEW, OLD = "0.2.1", "0.1.3"
#: NEW built ungated (examples/clef-vllm/setup.py): the gate's refusals are logged, the checkpoint served
UNGATED = f"{NEW}+ungated"
UNGATED_BUILD = "serve-what-the-gate-refuses"

#: the prompts every served configuration answers (token ids: the tiny vocabulary has 512)
PROMPTS = [[1, 5, 9, 33, 100, 7], [400, 3, 3, 3, 260, 511, 0, 42, 17, 230]]


def engine_kwargs(root: Path, pooling: bool = False) -> dict[str, Any]:
    """``vllm.LLM`` arguments for a tiny checkpoint: bfloat16 (the CPU Gated DeltaNet kernel's only
    dtype), eager (no torch.compile on a 2-core machine), text-only for the multimodal class (the
    fixtures ship no image processor config). ``pooling``: per-token hidden states."""
    config = json.loads((root / "config.json").read_text())
    kw: dict[str, Any] = {"dtype": "bfloat16", "max_model_len": 128, "max_num_seqs": 4, "seed": 0,
                          "enforce_eager": True}
    if "vision_config" in config:
        kw["language_model_only"] = True
    if pooling:
        kw.update(runner="pooling", pooler_config={"task": "token_embed"})
    return kw


def install_plugin(version: str, scratch: Path) -> Path:
    """Build examples/clef-vllm at ``version`` and ``pip install --target`` it into its own folder
    (``X.Y.Z+ungated``: the ungated build, ``CLEF_VLLM_UNGATED`` set as setup.py demands)."""
    import shutil

    src = scratch / f"src-{version}"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = scratch / f"plugin-{version}"
    public, _, local = version.partition("+")
    env = dict(os.environ, CLEF_VLLM_PLUGIN_VERSION=public)
    env.pop("CLEF_VLLM_UNGATED", None)
    if local == "ungated":
        env["CLEF_VLLM_UNGATED"] = UNGATED_BUILD
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(src)], check=True, env=env, cwd=str(scratch),
                   stdout=subprocess.DEVNULL)
    return target


class HostDied(RuntimeError):
    pass


class EngineHost:
    def __init__(self, name: str, pythonpath: list[Path], scratch: Path) -> None:
        self.name = name
        self.log_path = scratch / f"host-{name}.log"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*pythonpath, REPO, HERE])
        env.update({
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
            "HF_HOME": str(scratch / "hf"),
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the tiny models need a few MiB
            "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # apply_model sends a function to the worker
            "PYTHONUNBUFFERED": "1",
            "TOKENIZERS_PARALLELISM": "false",
        })
        read_fd, write_fd = os.pipe()
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen([sys.executable, str(HOST), "--reply-fd", str(write_fd)], stdin=subprocess.PIPE,
                                     stdout=self._log, stderr=self._log, pass_fds=(write_fd,), env=env, cwd=str(scratch),
                                     text=True)
        os.close(write_fd)
        self._replies = os.fdopen(read_fd, "r")
        self._read()  # ready

    def log_size(self) -> int:
        self._log.flush()
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")

    def _read(self) -> dict[str, Any]:
        ready, _, _ = select.select([self._replies], [], [], REPLY_TIMEOUT_S)
        line = self._replies.readline() if ready else ""
        if not line:
            tail = self.log_since(max(0, self.log_size() - 6000))
            raise HostDied(f"engine host {self.name} gave no reply (exit code {self.proc.poll()}); log tail:\n{tail}")
        return json.loads(line)

    def call(self, op: str, **kwargs: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kwargs}) + "\n")
        self.proc.stdin.flush()
        reply = self._read()
        if not reply.get("ok") and op not in ("start",):
            raise RuntimeError(f"{op} failed in engine host {self.name}: {reply.get('error')}\n{reply.get('traceback', '')}")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call("exit")
                self.proc.wait(timeout=120)
            except (HostDied, subprocess.TimeoutExpired, BrokenPipeError, RuntimeError):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


@dataclass
class Engine:
    """One configuration: started (``ok``) or refused at start-up (``error`` and the ``log`` the user saw)."""

    key: str
    host: EngineHost
    ok: bool
    error: str | None
    log: str
    start_s: float
    scratch: Path
    live: bool = True
    calls: int = field(default=0)

    def _require(self) -> None:
        if not self.ok:
            raise AssertionError(f"engine {self.key} did not start: {self.error}\n{self.log[-4000:]}")
        if not self.live:
            raise AssertionError(f"engine {self.key} was stopped; a test asked for it after another configuration")

    def generate(self, prompts: list[list[int]], logprobs: int = 5, max_tokens: int = 2) -> list[dict[str, Any]]:
        self._require()
        return self.host.call("generate", prompts=prompts, logprobs=logprobs, max_tokens=max_tokens)["results"]

    def hidden_states(self, prompts: list[list[int]]) -> list[Any]:
        import torch

        self._require()
        self.calls += 1
        out = self.scratch / f"hidden-{self.key}-{self.calls}.pt"
        self.host.call("encode", prompts=prompts, out=str(out))
        return torch.load(out)

    def probe(self, func: str, **kwargs: Any) -> list[Any]:
        """``engine_probes.<func>(model, **kwargs)`` in every worker; one result per worker."""
        self._require()
        return self.host.call("apply", func=f"engine_probes:{func}", kwargs=kwargs)["results"]


class Engines:
    """Session-wide: plugin setting -> host; configuration key -> engine (one live at a time)."""

    def __init__(self, scratch: Path, plugin_dirs: dict[str, Path]) -> None:
        self.scratch = scratch
        self.plugin_dirs = plugin_dirs
        self.hosts: dict[str, EngineHost] = {}
        self.engines: dict[str, Engine] = {}
        self.live: Engine | None = None
        self.starts: list[tuple[str, bool, float]] = []

    def _host(self, plugin: str | None) -> EngineHost:
        name = plugin or "no-plugin"
        if name not in self.hosts:
            path = [self.plugin_dirs[plugin]] if plugin else []
            self.hosts[name] = EngineHost(name, path, self.scratch)
        return self.hosts[name]

    def get(self, key: str, model: Path, plugin: str | None, env: dict[str, str] | None = None,
            **kwargs: Any) -> Engine:
        """The engine for ``key`` (started once): ``model`` served by vLLM with ``plugin`` installed (or none);
        ``env``: environment variables for this start only."""
        if key in self.engines:
            return self.engines[key]
        if self.live is not None:
            self.live.host.call("stop")
            self.live.live = False
            self.live = None
        host = self._host(plugin)
        offset = host.log_size()
        t0 = time.perf_counter()
        reply = host.call("start", model=str(model), kwargs=kwargs, env=env or {})
        engine = Engine(key, host, bool(reply["ok"]), reply.get("error"), host.log_since(offset), reply["start_s"],
                        self.scratch, live=bool(reply["ok"]))
        self.starts.append((key, engine.ok, time.perf_counter() - t0))
        self.engines[key] = engine
        if engine.ok:
            self.live = engine
        return engine

    def close(self) -> None:
        for host in self.hosts.values():
            host.close()

    def summary(self) -> str:
        lines = [f"  {key:<28} {'served' if ok else 'refused':<8} {s:6.1f} s" for key, ok, s in self.starts]
        return "engine starts (one per configuration):\n" + "\n".join(lines)


@dataclass
class Served:
    """What one served configuration answered: generation with log-probs, the worker's report on
    its tables (``engine_probes.tables_report``), and per-token hidden states (pooling runner)."""

    root: Path
    plugin: str | None
    generated: list[dict[str, Any]]
    report: dict[str, Any]
    hidden: list[Any] | None
    host_pid: int


def serve(engines: Engines, name: str, root: Path, plugin: str | None, option_ids: list[int],
          hidden: bool = True) -> Served:
    """Start the configuration's engine(s) once and take everything the tests ask of them."""
    gen = engines.get(f"{name} [{plugin}] generate", root, plugin, **engine_kwargs(root))
    generated = gen.generate(PROMPTS)
    (report,) = gen.probe("tables_report", token_ids=option_ids)  # one worker (no tensor parallelism)
    states = None
    if hidden:
        pool = engines.get(f"{name} [{plugin}] pooling", root, plugin, **engine_kwargs(root, pooling=True))
        states = pool.hidden_states(PROMPTS)
    return Served(root, plugin, generated, report, states, gen.host.proc.pid)
