"""Data at scale, side by side in one run: a generated corpus (the Python standard library's own
sources cut into ~4 KB documents, in 8 MB JSON-lines shards, repeated to the size asked for)
prepared

  (a) nanoGPT-style, written here: 2 worker processes tokenise (bytes) into one flat uint16 file
      (np.memmap), as nanoGPT's prepare.py does;
  (b) by the framework: `framework prepare-data data=text_files ... data.num_proc=2`, cold;

then, on the prepared corpus, a run's time to its first step (train.py, one process, a 1-layer
model; the time from start to the first logged step, against the same run on a small corpus: what
the data adds) and its anonymous memory (RssAnon) at that step, at every corpus size (it must not
grow with the corpus); and a cold run at one and at two processes: its preparation time (the two
prepare once, the second waiting, and must be no slower) and its time to the first step; and a
streamed run's (data.streaming=true) time to its first step, with nothing prepared.

    .venv/bin/python benchmarks/data_prep.py                 (1 GB and 4 GB where the disk allows; ~15 min)
    .venv/bin/python benchmarks/data_prep.py --sizes 0.05    (a quick look)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
from results_table import publish  # benchmarks/ is on sys.path when a script runs

ROOT = Path(__file__).resolve().parents[1]
SHARD_BYTES = 8 << 20
DOC_CHARS = 4000
RUN = ["model.n_layer=1", "model.n_embd=64", "model.n_head=4", "model.block_size=1024", "data.block_size=1024",
       "data.batch_size=8", "trainer.max_steps=1", "trainer.log_every=1", "trainer.val_at_start=false",
       "trainer.val_every=1000", "trainer.val_batches=1", "trainer.progress_bar=false", "trainer.plot=false",
       "callbacks=[]", "logger=[]", "data=text_files"]


def make_corpus(folder: Path, size: int) -> int:
    """JSON-lines shards of ~4 KB documents (stdlib sources, repeated with a counter so that no two
    documents are the same) until `size` bytes; returns the bytes written."""
    sources = [p.read_text(errors="replace") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py"))[:2000]]
    documents = [s[i:i + DOC_CHARS] for s in sources for i in range(0, len(s), DOC_CHARS) if s[i:i + DOC_CHARS].strip()]
    folder.mkdir(parents=True, exist_ok=True)
    written, shard, n = 0, 0, 0
    out = open(folder / f"part-{shard:05d}.jsonl", "w")
    while written < size:
        line = json.dumps({"text": f"# document {n}\n" + documents[n % len(documents)]}) + "\n"
        out.write(line)
        written += len(line)
        n += 1
        if out.tell() >= SHARD_BYTES:
            out.close()
            shard += 1
            out = open(folder / f"part-{shard:05d}.jsonl", "w")
    out.close()
    return written


def _tokenise_file(path: str) -> np.ndarray:
    with open(path) as f:
        return np.concatenate([np.frombuffer(json.loads(line)["text"].encode(), np.uint8).astype(np.uint16)
                               for line in f if line.strip()])


def nanogpt_style(folder: Path, out: Path) -> float:
    """Two processes tokenise every shard; the tokens are written into one flat uint16 memmap."""
    started = time.time()
    files = sorted(str(p) for p in folder.glob("*.jsonl"))
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        arrays = pool.map(_tokenise_file, files)
    total = sum(len(a) for a in arrays)
    flat = np.memmap(out, dtype=np.uint16, mode="w+", shape=(total,))
    at = 0
    for array in arrays:
        flat[at:at + len(array)] = array
        at += len(array)
    flat.flush()
    return time.time() - started


def framework_prepare(folder: Path, cache: Path) -> tuple[float, str]:
    started = time.time()
    result = subprocess.run([sys.executable, "-m", "framework", "prepare-data", "data=text_files",
                             f"data.files={folder}/*.jsonl", f"data.cache_dir={cache}", "data.num_proc=2"],
                            capture_output=True, text=True, cwd=ROOT)
    if result.returncode:
        sys.exit(f"prepare-data failed: {result.stderr[-2000:]}")
    return time.time() - started, result.stdout.strip().splitlines()[-1]


def first_step(folder: Path, cache: Path, workdir: Path, devices: int = 1, extra: tuple = ()) -> tuple[float, float]:
    """(seconds from start to the first logged step, anonymous memory in MiB then)."""
    out = workdir / f"run-{len(list(workdir.iterdir()))}"
    probe = ("import os, re\n"
             "from framework.callbacks.base import Callback\n"
             "class Probe(Callback):\n"
             "    def on_train_step_end(self, loop):\n"
             "        anon = re.search(r'RssAnon:\\s+(\\d+)', open('/proc/self/status').read())\n"
             "        print('ANON_KB', anon.group(1), flush=True)\n")
    (workdir / "probe_callback.py").write_text(probe)
    args = [sys.executable, str(ROOT / "train.py"), *RUN, f"data.files={folder}/*.jsonl", f"data.cache_dir={cache}",
            f"devices={devices}", "+callbacks.probe._target_=probe_callback.Probe", "trust.allow=[probe_callback.]",
            f"hydra.run.dir={out}", *extra]
    started = time.time()
    result = subprocess.run(args, capture_output=True, text=True, cwd=workdir,
                            env={**os.environ, "PYTHONPATH": f"{workdir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"})
    seconds = time.time() - started
    if result.returncode:
        sys.exit(f"train.py failed: {result.stderr[-3000:]}")
    anon = re.search(r"ANON_KB (\d+)", result.stdout)
    return seconds, int(anon.group(1)) / 1024 if anon else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4", help="corpus sizes in GB, comma-separated")
    parser.add_argument("--workdir", default=None, help="where the corpora go (default: a temporary folder)")
    args = parser.parse_args()
    sizes = [float(s) for s in args.sizes.split(",")]
    root = Path(args.workdir or tempfile.mkdtemp(prefix="data-prep-"))
    lines = [f"Byte-level tokens, ~4 KB documents in 8 MB JSON-lines shards, {os.cpu_count()} CPU cores; run "
             f"{time.strftime('%Y-%m-%d')}.", "",
             "| corpus | nanoGPT-style memmap (s) | framework, cold (s) | ratio | store | first step, prepared (s) "
             "| beyond a tiny corpus's (s) | RssAnon at the first step (MiB) |",
             "|---|---|---|---|---|---|---|---|"]
    cold = ""
    try:
        small = root / "small"
        make_corpus(small, 2 << 20)
        (root / "runs").mkdir(exist_ok=True)
        baseline, _ = first_step(small, root / "cache-small", root / "runs")
        baseline, _ = first_step(small, root / "cache-small", root / "runs")  # prepared: start-up alone
        for size in sizes:
            need = int(size * 2.2e9)
            if shutil.disk_usage(root).free < need:
                lines.append(f"| {size:g} GB | skipped: {shutil.disk_usage(root).free / 1e9:.0f} GB free, "
                             f"{need / 1e9:.0f} needed | | | | | | |")
                continue
            corpus = root / f"corpus-{size:g}"
            written = make_corpus(corpus, int(size * 1e9))
            memmap = nanogpt_style(corpus, root / "nanogpt.bin")
            (root / "nanogpt.bin").unlink()
            cache = root / f"cache-{size:g}"
            ours, said = framework_prepare(corpus, cache)
            store = re.search(r"\(([\d.]+ \w+);", said)
            seconds, anon = first_step(corpus, cache, root / "runs")
            lines.append(f"| {written / 1e9:.2f} GB | {memmap:.1f} | {ours:.1f} | {ours / memmap:.2f}x | "
                         f"{store.group(1) if store else '?'} | {seconds:.1f} | {seconds - baseline:.1f} | {anon:.0f} |")
            print(lines[-1], flush=True)
            shutil.rmtree(cache)
            if size == sizes[0]:  # a cold start at one and at two processes (preparing inside the run)
                one, _ = first_step(corpus, root / "cold-1", root / "runs", devices=1)
                two, _ = first_step(corpus, root / "cold-2", root / "runs", devices=2)
                prep = [json.loads(next((root / f"cold-{n}").glob("text-*/manifest.json")).read_text())["seconds"]
                        for n in (1, 2)]
                cold = (f"Cold start (the run prepares), {written / 1e9:.2f} GB: preparing took {prep[0]:.1f} s in a "
                        f"one-process run and {prep[1]:.1f} s in a two-process run ({prep[1] / prep[0]:.2f}x: one "
                        f"prepares, the other waits); to the first step {one:.1f} s and {two:.1f} s (the second "
                        "process's start-up included).")
                shutil.rmtree(root / "cold-1")
                shutil.rmtree(root / "cold-2")
                streamed, anon = first_step(corpus, root / "stream", root / "runs", extra=("data.streaming=true",))
                cold += (f" Streamed (data.streaming=true: nothing prepared, the files read as it trains): the first "
                         f"step after {streamed:.1f} s, RssAnon {anon:.0f} MiB.")
                shutil.rmtree(root / "stream", ignore_errors=True)
            shutil.rmtree(corpus)
        lines += ["", f"Start-up alone (a 2 MB corpus, prepared): {baseline:.1f} s to the first step.", cold]
    finally:
        if not args.workdir:
            shutil.rmtree(root, ignore_errors=True)
    publish("data_prep", lines)


if __name__ == "__main__":
    main()
