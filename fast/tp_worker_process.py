"""The process of a tensor-parallel rank > 0 on one host, started by rank 0 (fast.tp_launch) as

    python -P -m fast.tp_worker_process --rank R --fd N

File descriptor N is this process's end of a socket pair private to it and rank 0. Nothing of the
user's program is imported: not its main module, which multiprocessing's "spawn" re-imports in
every child (that fails for a script fed on standard input, and would run a script's top level
again), only this package and the modules that the spec's pickle names. Rank 0 puts the directory
of its own copy of the package first on PYTHONPATH, and `-P` keeps the working directory off
sys.path, so that the worker runs the code rank 0 runs.

On the socket pair (multiprocessing.connection):

    rank 0 -> worker   (authkey, sys.path) of rank 0's process
    rank 0 -> worker   the WorkerSpec, pickled with torch.multiprocessing's reductions: a checkpoint
                       as its path; tensors in memory as shared memory, never as their bytes (CPU:
                       file descriptors, handed over by multiprocessing's resource sharer, which
                       checks rank 0's authkey; CUDA: IPC handles)
    worker -> rank 0   (STARTED, "") once the spec is rebuilt; (FAILED, traceback) if anything fails,
                       from the first message on (importing torch and this package included)
    end of file        rank 0's end closes when its process dies, however it dies: the worker
                       leaves at once. The worker's end closes when it exits: rank 0 then reads
                       its exit code.

Only the standard library is imported at the top, so that a worker that cannot import torch or the
engine still reports why.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import sys
import threading
import traceback
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fast.tp_worker import WorkerSpec

STARTED = "started"
FAILED = "failed"
MODULE = "fast.tp_worker_process"  # what rank 0 runs with -m


def main(argv: list[str] | None = None) -> None:
    """Receive the spec, report in, serve until rank 0 says stop; report any failure, then leave."""
    arguments = _parse_arguments(argv)
    connection = multiprocessing.connection.Connection(arguments.fd)
    try:
        spec = _receive_spec(connection)
        connection.send((STARTED, ""))
        # Imported here, not at the top, so that a failure to import the engine is reported too.
        from fast.tp_worker import serve_rank

        serve_rank(arguments.rank, spec.device_for(arguments.rank), spec)
    except BaseException:
        _report(connection, (FAILED, traceback.format_exc()))
        # Leave at once: a broken process group can block in the destructors of a normal exit.
        os._exit(1)
    # Stopped cleanly, groups destroyed. Leave without the interpreter's teardown too: destructors of
    # captured CUDA graphs and symmetric memory at exit have nothing left to do but could wait on peers.
    connection.close()
    logging.shutdown()
    os._exit(0)


def _parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description="a tensor-parallel rank > 0")
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--fd", type=int, required=True, help="this process's end of its socket pair with rank 0")
    return parser.parse_args(argv)


def _receive_spec(connection: multiprocessing.connection.Connection) -> WorkerSpec:
    authkey, sys_path = connection.recv()
    # The resource sharer that hands over the file descriptors of shared tensors accepts rank 0's authkey only.
    multiprocessing.current_process().authkey = authkey
    # Modules resolve as in rank 0, as after multiprocessing's spawn (the classes the pickle names,
    # e.g. a Mapping subclass holding the weights).
    sys.path[:] = sys_path
    payload = connection.recv_bytes()
    _exit_when_rank_0_exits(connection)
    return pickle.loads(payload)


def _exit_when_rank_0_exits(connection: multiprocessing.connection.Connection) -> None:
    """A worker never outlives rank 0's process, even one killed without a chance to clean up: rank 0
    sends nothing after the spec, so the socket becomes readable only at end of file."""

    def watch() -> None:
        multiprocessing.connection.wait([connection])
        os._exit(1)

    threading.Thread(target=watch, name="twinfer-tp-rank-0-watch", daemon=True).start()


def _report(connection: multiprocessing.connection.Connection, message: tuple[str, str]) -> None:
    try:
        connection.send(message)
    except OSError:  # rank 0 is gone: nobody to tell
        pass


if __name__ == "__main__":
    main()
