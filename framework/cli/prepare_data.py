"""`framework prepare-data [-r RECIPE] [OVERRIDES...]`: prepare a run's data now, not at its start.

The data of the config (the shipped one, or a recipe's) with the overrides is read, tokenised and
written to its store (framework/data/prepare.py) with progress and an ETA, in `data.num_proc`
processes; a later run (any number of processes or nodes) finds it ready. Data that needs no
preparation (a built-in set, a stream) says so. Nothing is trained; no process group is started.
"""
from __future__ import annotations

import time
from pathlib import Path

from framework.cli.options import split_options
from framework.config.build import build
from framework.config.compose import compose
from framework.console import human_bytes
from framework.data.store import directory_size, read_manifest
from framework.errors import ConfigError, ExitCode, StorageError, UserError, report
from framework.paths import conf_dir, find_recipe

USAGE = "usage: framework prepare-data [-r RECIPE] [OVERRIDES...]"


def main(args: list[str]) -> int:
    try:
        options, overrides = split_options(args, ("--recipe", "-r"), "framework prepare-data", USAGE)
        if "--recipe" in options:
            path = find_recipe(options["--recipe"])
            cfg = compose(path.parent, path.stem, overrides)
        else:
            cfg = compose(Path(conf_dir()), "train", overrides)
        data = build(cfg.data, "data")
        problems = data.problems()
        if problems:
            raise ConfigError("\n".join(problems))
        if not hasattr(data, "store_spec"):
            print(f"data={type(data).__name__}: nothing to prepare (it is built when a run starts)")
            return ExitCode.OK
        if getattr(data, "streaming", False):
            print("data.streaming=true: nothing to prepare (the files are read while the run trains; "
                  "data.streaming=false prepares a store every rank shares)")
            return ExitCode.OK
        started = time.time()
        data.prepare_data(say=print)
        manifest = read_manifest(data._store) or {}
        splits = ", ".join(f"{name} {tokens:,} tokens in {docs:,} documents"
                           for name, (tokens, docs) in manifest.get("splits_summary", {}).items())
        print(f"ready: {data._store} ({human_bytes(directory_size(data._store))}; {splits}; fingerprint "
              f"{manifest.get('fingerprint')}) in {time.time() - started:.1f} s")
        return ExitCode.OK
    except UserError as err:
        report(err)
        return ExitCode.STORAGE if isinstance(err, StorageError) else ExitCode.USER_ERROR
