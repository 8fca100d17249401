"""What every local worker needs, imported once by the forkserver the workers are forked from
(framework/launch/elastic.py). Each worker then starts with these modules already in memory and
shares their pages with the forkserver and its siblings (copy-on-write) instead of importing its
own copy: `import torch` alone is ~145 MiB of anonymous memory per process and torch._dynamo
~70 MiB, so a 4-worker job's peak is 300-500 MiB lower (benchmarks/README.md), and the workers
skip those imports at start.

The objects those imports made are then frozen (`gc.freeze`): Python's cyclic collector in a
worker would otherwise write to every one of them as it scans, and each write copies a shared
page into the worker's own memory (~50 MiB per worker by the end of set-up for a ~100M GPT: the
whole job's peak at 2 workers 115 MiB lower with the freeze). Nothing frozen here is garbage:
module-level objects live as long as the process.

Nothing imported here starts a device: CUDA must be initialised in the worker, never before a
fork (torch then refuses it in the child)."""
import gc

import torch  # noqa: F401

import framework.launch.elastic  # noqa: F401  (the workers' entry: unpickling it imports the framework)

try:
    # A torch optimizer's first step imports it (sympy with it) in every worker.
    import torch._dynamo  # noqa: F401
except Exception:  # noqa: BLE001 - only a saving: a worker that needs it imports it and reports the error there
    pass

gc.collect()  # what the imports left as garbage is freed, not frozen for ever
gc.freeze()  # the forked workers' collectors never scan (and so never copy) these pages
