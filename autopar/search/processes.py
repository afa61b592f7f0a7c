"""Run a few functions of a search in forked worker processes, with messages back (progress) while they run.

The oracle's batches are independent (each prices its own plans; only the running front links them), so a machine
with several CPUs runs them in several processes. Forking (not spawning) is what makes that cheap: a child starts
with everything the parent built (the model, the search space, the structure tables, the per-structure caches) and
only its result travels back, pickled through a pipe. The children run numpy on modules already imported and
nothing else (no threads of their own, no files, no imports of new libraries); their standard streams point at
/dev/null and their warnings are off, and they leave by os._exit: that is what makes a fork safe where the parent
has started threads of its own (`autopar solve`'s progress bar and its background import of ortools), whose locks
(a stream's, the console's) a child never takes.

A child that cannot start (fork refused: a container's process limit, memory overcommit refused) or that ends
without its result (killed: the out-of-memory killer, a signal) is reported as `Lost` in its place, not raised: the
caller runs that share of the work itself (`autopar.search.oracle.search_in_processes`), so the answer does not
depend on the workers. A child that outlives its parent (the parent killed by a signal) stops at its next message.

Where fork is not the platform's default start method (macOS, Windows: system libraries there are not fork-safe)
and inside a daemonic worker process (which may not have children), `usable_processes` says 1 and the caller runs
the work itself.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

MAX_SEARCH_PROCESSES = 8
"""Processes a search uses at most when asked for none in particular: each holds a batch of plans (a few hundred MB
at the oracle's CHUNK_PLANS), and past a handful the batches left per process are too few to share out evenly."""


@dataclass(frozen=True)
class Lost:
    """The place of a task whose child did not start, or ended without a result."""

    why: str


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a child, as its cause (the child's frames, which the parent's
    traceback of the re-raised exception does not show)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def can_fork() -> bool:
    """Whether this process may fork workers: Linux (fork its default start method) and not a daemonic worker."""
    return (sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
            and not multiprocessing.current_process().daemon)


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask where the OS has one, within a cgroup v2 CPU quota where one is
    set (a container's `--cpus`: /sys/fs/cgroup/cpu.max, quota and period in µs)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):        # no cgroup v2 file, or one that does not read: the affinity mask alone
        pass
    return max(1, cpus)


def usable_processes(requested: int | None) -> int:
    """Processes to use: `requested` (None: MAX_SEARCH_PROCESSES), never more than the CPUs this process may use
    (`available_cpus`); 1 where forking is not possible (`can_fork`)."""
    if not can_fork():
        return 1
    wanted = MAX_SEARCH_PROCESSES if requested is None else max(1, int(requested))
    return min(wanted, available_cpus())


def run_forked(tasks: Sequence[Callable[[Callable[[Any], None]], Any]],
               on_message: Callable[[Any], None] = lambda message: None) -> list:
    """[task(send) for task in tasks], each task in a forked child process, their results in order; a `Lost` in
    the place of a child that did not start or ended without a result. A task may call `send(message)` as it goes;
    the parent hands each message to `on_message` as it arrives. An exception a task raises is raised here (the
    first one to arrive, the child's traceback as its cause); the other children are then stopped."""
    context = multiprocessing.get_context("fork")
    _flush_standard_streams()      # else a child flushes its copy of what the parent had buffered: printed twice
    parent = os.getpid()
    children: list = [None] * len(tasks)
    readers: dict = {}
    results: list = [None] * len(tasks)
    try:
        for index, task in enumerate(tasks):
            try:
                reader, writer = context.Pipe(duplex=False)
            except OSError as error:          # out of file descriptors
                results[index] = Lost(f"no pipe for it ({error})")
                continue
            child = context.Process(target=_child_main, args=(task, writer, parent), daemon=True)
            try:
                child.start()
            except OSError as error:          # fork refused: a process limit, overcommit refused
                reader.close()
                writer.close()
                results[index] = Lost(f"it could not start ({error})")
                continue
            writer.close()
            children[index] = child
            readers[reader] = index
        while readers:
            for reader in wait(list(readers)):
                index = readers[reader]
                try:
                    kind, value = reader.recv()
                except EOFError:
                    del readers[reader]
                    reader.close()
                    children[index].join()
                    results[index] = Lost(f"it ended without a result (exit code {children[index].exitcode})")
                    continue
                if kind == "message":
                    on_message(value)
                    continue
                del readers[reader]
                reader.close()
                if kind == "error":
                    error, remote = value
                    raise error from RemoteTraceback(remote)
                results[index] = value
        for child in children:
            if child is not None:
                child.join()
        return results
    finally:
        for child in children:
            if child is not None and child.is_alive():
                child.terminate()
                child.join()
        for reader in readers:
            reader.close()


def _child_main(task: Callable[[Callable[[Any], None]], Any], writer, parent: int) -> None:
    """A child's whole life: run the task, send its messages and then its result (or its exception and traceback),
    stop at a message once its parent is gone, and leave without the interpreter's exit (which would flush the
    standard streams)."""
    try:
        _quiet_child()

        def send(message: Any) -> None:
            if os.getppid() != parent:       # the parent was killed: nobody reads this, and the rest is wasted
                os._exit(1)
            writer.send(("message", message))

        writer.send(("result", task(send)))
    except BaseException as error:       # handed to the parent, which raises it
        remote = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(error))          # the parent must be able to rebuild it
        except Exception:                # an exception that does not round-trip through pickle: its text
            error = RuntimeError(f"{type(error).__name__}: {error}")
        try:
            writer.send(("error", (error, remote)))
        except Exception:                # the pipe is gone (the parent left): nothing to tell
            pass
    finally:
        try:
            writer.close()
        finally:
            os._exit(0)


def _quiet_child() -> None:
    """A child writes nothing: its standard streams to /dev/null (the parent's stream objects, whose locks a thread
    of the parent may have held at the fork, are never touched) and its warnings off."""
    null = open(os.devnull, "w")                 # noqa: SIM115 - the child's streams until os._exit
    sys.stdout = sys.stderr = null
    warnings.simplefilter("ignore")


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):      # closed, or a reader that left: nothing buffered to copy
            pass
