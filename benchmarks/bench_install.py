"""Installed size and install time of the wheel in a fresh virtual environment, per distribution.

    python benchmarks/bench_install.py [--wheel-dir DIR] [--venv DIR] [--keep] [--json]

Builds the wheel (``pip wheel --no-deps``), makes a bare venv, measures its site-packages (``du``),
installs the wheel with the registry's pip as a normal machine would (``PIP_CONFIG_FILE=/dev/null``,
no ``PIP_FIND_LINKS``), times the install, and measures again. Per distribution: the disk usage of
the files its RECORD lists (``.pyc`` files pip compiled included), ``du``-style (allocated blocks).
Then the installed ``clef-format example`` is run (a tiny layout-1 build) and must verify OK.

``--per-package-time``: also download every wheel once (``pip download``, timed) and install each
distribution alone (``--no-deps --no-index``) into a second fresh venv, timing each install (unpack
and byte-compile, no network).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGISTRY_ENV = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def du(path: Path) -> int:
    """Allocated bytes under ``path`` (what ``du -sk`` counts, times 1024)."""
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) * 1024


def disk_bytes(path: Path) -> int:
    try:
        return path.lstat().st_blocks * 512
    except FileNotFoundError:
        return 0


def site_packages(venv: Path) -> Path:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout
    return Path(out.strip())


def per_distribution(sp: Path) -> dict[str, int]:
    """Bytes on disk per installed distribution, from each RECORD (the dist-info itself included)."""
    sizes: dict[str, int] = {}
    for record in sorted(sp.glob("*.dist-info/RECORD")):
        name = record.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        total = 0
        with open(record, newline="") as fh:
            for row in csv.reader(fh):
                if row and not row[0].startswith(".."):
                    total += disk_bytes(sp / row[0])
        sizes[name] = total
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel-dir", type=Path, default=None)
    ap.add_argument("--venv", type=Path, default=None)
    ap.add_argument("--python", default=sys.executable, help="the interpreter the venv is made from")
    ap.add_argument("--keep", action="store_true", help="keep the venv (its path is printed)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--per-package-time", action="store_true", help="time each distribution's install alone")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="clef-install-"))
    wheel_dir = args.wheel_dir or work / "wheel"
    venv = args.venv or work / "venv"
    env = {**os.environ, **REGISTRY_ENV}
    env.pop("PYTHONPATH", None)

    # From a copy of the working tree: setuptools leaves build/ and *.egg-info in the tree it builds.
    src = work / "src"
    shutil.copytree(ROOT, src, symlinks=True,
                    ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__", ".bench"))
    subprocess.run([args.python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(src)],
                   check=True, env=env)
    wheel = max(wheel_dir.glob("clef_format-*.whl"), key=lambda p: p.stat().st_mtime)
    subprocess.run([args.python, "-m", "venv", str(venv)], check=True)
    sp = site_packages(venv)
    bare = du(sp)
    bare_dists = set(per_distribution(sp))
    t0 = time.perf_counter()
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True, env=env)
    install_s = time.perf_counter() - t0
    after = du(sp)
    dists = {k: v for k, v in per_distribution(sp).items() if k not in bare_dists}

    example = work / "example"
    t0 = time.perf_counter()
    proc = subprocess.run([str(venv / "bin" / "clef-format"), "example", str(example), "--layout", "layout-1", "--json"],
                          capture_output=True, text=True, env=env, cwd=work)
    example_s = time.perf_counter() - t0
    example_ok = proc.returncode == 0 and json.loads(proc.stdout)["ok"]
    torch_absent = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch"], capture_output=True).returncode != 0

    per_time: dict[str, float] = {}
    download_s = None
    if args.per_package_time:
        wheels = work / "wheels"
        t0 = time.perf_counter()
        subprocess.run([str(venv / "bin" / "pip"), "download", "-q", "-d", str(wheels), str(wheel)], check=True, env=env)
        download_s = round(time.perf_counter() - t0, 1)
        venv2 = work / "venv-each"
        subprocess.run([args.python, "-m", "venv", str(venv2)], check=True)
        for whl in sorted(wheels.glob("*.whl")):
            t0 = time.perf_counter()
            subprocess.run([str(venv2 / "bin" / "pip"), "install", "-q", "--no-deps", "--no-index", str(whl)],
                           check=True, env=env)
            per_time[whl.name.split("-")[0]] = round(time.perf_counter() - t0, 2)

    result = {
        "wheel": wheel.name, "wheel_bytes": wheel.stat().st_size, "install_s": round(install_s, 1),
        "bare_site_packages_bytes": bare, "site_packages_bytes": after, "installed_bytes": after - bare,
        "distributions": dict(sorted(dists.items(), key=lambda kv: -kv[1])),
        "example_ok": example_ok, "example_s": round(example_s, 2), "torch_absent": torch_absent,
        "venv": str(venv) if args.keep else None,
        "download_s": download_s, "install_s_per_distribution": per_time,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        mb = 1e6
        print(f"wheel {wheel.name}: {wheel.stat().st_size / 1e3:.0f} KB")
        print(f"install: {install_s:.1f} s (downloads included)")
        print(f"site-packages: {after / mb:.1f} MB, bare venv {bare / mb:.1f} MB, installed {(after - bare) / mb:.1f} MB")
        print("| distribution | MB | install s (alone) |\n| --- | ---: | ---: |")
        for name, size in result["distributions"].items():
            print(f"| {name} | {size / mb:.1f} | {per_time.get(name, '')} |")
        if download_s is not None:
            print(f"download of every wheel: {download_s} s")
        print(f"clef-format example (layout-1): exit {proc.returncode}, ok={example_ok}, {example_s:.2f} s;"
              f" torch importable: {not torch_absent}")
        if not example_ok:
            print(proc.stdout[-2000:], proc.stderr[-2000:], file=sys.stderr)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
