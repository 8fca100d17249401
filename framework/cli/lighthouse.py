"""`framework lighthouse`: a torchft lighthouse for replica groups started separately (a SLURM
array task per group, a torchrun per group), each given its address:

    framework lighthouse --min-replicas 1 --port 29510
    python train.py fault_tolerance=torchft fault_tolerance.replica_id=0 fault_tolerance.lighthouse=HOST:29510 ...
"""
from __future__ import annotations

import argparse
import os
import signal
import threading

from framework.errors import ExitCode


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="framework lighthouse", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=29510, help="the port to listen on (0: a free one); default 29510")
    p.add_argument("--min-replicas", type=int, default=1, help="groups a quorum needs (fault_tolerance.min_replicas)")
    p.add_argument("--join-timeout-ms", type=int, default=1000,
                   help="how long to wait for more groups once min-replicas have joined")
    p.add_argument("--heartbeat-timeout-ms", type=int, default=5000, help="silence after which a group counts as gone")
    return p


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    os.environ.setdefault("RUST_LOG", "warn")  # torchft's server says every quorum at INFO
    try:
        from torchft.coordination import LighthouseServer
    except ImportError:
        print("framework lighthouse: torchft is not installed; pip install 'framework[torchft]'", flush=True)
        return ExitCode.USER_ERROR
    try:
        server = LighthouseServer(bind=f"[::]:{args.port}", min_replicas=args.min_replicas,
                                  join_timeout_ms=args.join_timeout_ms, quorum_tick_ms=100,
                                  heartbeat_timeout_ms=args.heartbeat_timeout_ms)
    except Exception as err:  # noqa: BLE001 - torchft's Rust server raises plain exceptions
        print(f"framework lighthouse: could not listen on port {args.port}: {str(err).splitlines()[0]}; choose another "
              "--port (0: a free one).", flush=True)
        return ExitCode.USER_ERROR
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the address is out: a caller may stop it at once
        signal.signal(sig, lambda *_: stop.set())
    address = server.address()
    print(f"lighthouse at {address}; groups join with fault_tolerance.lighthouse={address.split('://', 1)[-1]} "
          "(Ctrl-C stops it)", flush=True)
    while not stop.wait(0.5):  # woken to run the handlers: a bare wait can miss them while torchft's threads run
        pass
    server.shutdown()
    return ExitCode.OK
