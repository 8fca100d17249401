"""Prepares .gpu/ for the GPU check on a machine lent without network (docs/gpus.md, "A GPU machine
without network"): what the framework needs beyond the machine's own CUDA torch, for the machine's
Python, ready to travel with the source tree.

- .gpu/site (and packed, .gpu/site.tar.gz, which is what travels): installed (not compiled)
  packages, first on PYTHONPATH there: hydra-core, omegaconf,
  torchdata, DeepSpeed (its ops built there on first use), fairscale, bitsandbytes (its CPU library
  and those of the CUDA versions asked for), torchft, and their dependencies;
- .gpu/hf: wheels of transformers 5 and its hub, installed there by benchmarks/gpu_session.sh
  where the machine's transformers is older (installed, they would not fit the 64 MiB a tree
  carries);
- torch, its CUDA libraries and what torch itself needs are the machine's own.

Its pip uses pip's own configuration (pip.conf, PIP_INDEX_URL). The requirement ranges are
pyproject.toml's, read from the installed framework's metadata (make setup installs it).

    python benchmarks/gpu_bundle.py                                  (Python 3.12, CUDA 13.x libraries)
    python benchmarks/gpu_bundle.py --python-version 3.11 --bnb-cuda 128,130
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# built here from their sources (no wheels are published): pure Python once built; antlr4 at the
# version hydra-core and omegaconf pin
FROM_SOURCE = ["antlr4-python3-runtime", "fairscale", "deepspeed"]
PINNED = {"antlr4-python3-runtime": "==4.9.3"}
# by name, at the ranges of the framework's own requirements (pyproject.toml, as installed); rich,
# psutil, numpy and scikit-learn are on the GPU machines (benchmarks/gpu_session.sh says where each
# package the framework needs is found there)
WANTED = ["hydra-core", "omegaconf", "torchdata", "bitsandbytes", "torchft", "safetensors", "fairscale", "deepspeed"]
HF = ["transformers", "tokenizers"]
# on any machine with torch: torch itself, its CUDA libraries and its own dependencies
THE_MACHINES = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*|numpy|scipy|sympy|mpmath|networkx|jinja2|markupsafe|"
                          r"filelock|fsspec|setuptools|joblib|threadpoolctl)$")
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "any"]


def requirement_specs() -> dict[str, str]:
    """Each package to bundle -> its requirement, at the framework's own range (extras included)."""
    ranges = {canonicalize_name(r.name): str(r.specifier) for r in map(Requirement, requires("framework") or [])}
    return {name: name + (PINNED.get(name) or ranges.get(name, "")) for name in [*FROM_SOURCE, *WANTED, *HF]}


def pip(*args: str, env: dict | None = None) -> None:
    print("+ pip", " ".join(args)[:300], flush=True)
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env)


def target(python_version: str) -> list[str]:
    """pip's options that choose wheels for the GPU machine's Python and platform."""
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            *(f"--platform={p}" for p in PLATFORMS)]


def resolve(specs: list[str], links: Path, python_version: str) -> list[tuple[str, str]]:
    """(name, version) of everything `specs` install on the GPU machine, less what it has."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        pip("install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report), "--target",
            str(Path(tmp) / "t"), "--find-links", str(links), *target(python_version), *specs)
        installs = json.loads(report.read_text())["install"]
    found = [(i["metadata"]["name"], i["metadata"]["version"]) for i in installs]
    return [(name, version) for name, version in found if not THE_MACHINES.match(name.lower())]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12", help="the GPU machine's Python (default 3.12)")
    parser.add_argument("--bnb-cuda", default="130,132",
                        help="bitsandbytes' CUDA libraries to keep, by CUDA version as torch.version.cuda says it "
                             "without the dot (default 130,132; its CPU library always)")
    parser.add_argument("--dest", default=str(ROOT / ".gpu"))
    args = parser.parse_args()
    dest = Path(args.dest)
    wheels, site, hf = dest / "whl", dest / "site", dest / "hf"
    for folder in (wheels, site, hf):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    spec = requirement_specs()

    # 1. the ones published only as sources, built into wheels here (DeepSpeed without its ops)
    pip("wheel", "--quiet", "--no-deps", "-w", str(wheels), *(spec[name] for name in FROM_SOURCE),
        env={**os.environ, "DS_BUILD_OPS": "0"})
    # 2. the rest of what they need, as wheels for the GPU machine
    needed = resolve([spec[name] for name in WANTED], wheels, args.python_version)
    built = {canonicalize_name(p.name.split("-")[0]) for p in wheels.glob("*.whl")}
    fetch = [f"{name}=={version}" for name, version in needed if canonicalize_name(name) not in built]
    pip("download", "--quiet", "--no-deps", "-d", str(wheels), *target(args.python_version), *fetch)
    pip("install", "--quiet", "--no-deps", "--no-compile", "--target", str(site), *target(args.python_version),
        *map(str, sorted(wheels.glob("*.whl"))))
    # 3. transformers and its hub, as wheels, for machines whose transformers is older than 5
    have = {canonicalize_name(name) for name, _ in needed}
    hf_needed = [f"{name}=={version}" for name, version in resolve([spec[n] for n in HF], wheels, args.python_version)
                 if canonicalize_name(name) not in have]
    pip("download", "--quiet", "--no-deps", "-d", str(hf), *target(args.python_version), *hf_needed)

    # bitsandbytes ships a library per CUDA version (20-26 MB each): those asked for only
    keep = {"libbitsandbytes_cpu.so", *(f"libbitsandbytes_cuda{v.strip()}.so" for v in args.bnb_cuda.split(","))}
    for library in (site / "bitsandbytes").glob("libbitsandbytes_*.so"):
        if library.name not in keep:
            library.unlink()
    for stray in ("benchmarks", "tests"):  # top-level folders some sdists install (fairscale's benchmarks)
        shutil.rmtree(site / stray, ignore_errors=True)
    shutil.rmtree(wheels)
    packed = dest / "site.tar.gz"  # a third of its size: what travels (gpu_session.sh unpacks it)
    with tarfile.open(packed, "w:gz") as tar:
        tar.add(site, arcname="site")

    def size(path: Path) -> float:
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        return sum(p.stat().st_size for p in files) / 2**20

    print(f"{site}: {size(site):.1f} MiB, packed {size(packed):.1f} MiB; {hf}: {size(hf):.1f} MiB. To carry: {packed} "
          f"and {hf} (a tree carries 64 MiB in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
