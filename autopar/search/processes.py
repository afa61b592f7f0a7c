"""Run a few functions of a search in forked worker processes, with messages back (progress) while they run.

The oracle's batches are independent (each prices its own plans; only the running front links them), so a machine
with several CPUs runs them in several processes. Forking (not spawning) is what makes that cheap: a child starts
with everything the parent built (the model, the search space, the structure tables, the per-structure caches) and
only its result travels back, pickled through a pipe. The children run numpy on modules already imported and
nothing else (no threads of their own, no console, no files, no imports of new libraries), and leave by os._exit
without flushing the standard streams: that is what makes a fork safe where the parent has started threads of its
own (`autopar solve`'s progress bar and its background import of ortools), whose locks a child never takes.

Where fork is not the platform's default start method (macOS, Windows: system libraries there are not fork-safe)
and inside a daemonic worker process (which may not have children), `usable_processes` says 1 and the caller runs
the work itself.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import warnings
from collections.abc import Callable, Sequence
from multiprocessing.connection import wait
from typing import Any, TypeVar

T = TypeVar("T")

MAX_SEARCH_PROCESSES = 8
"""Processes a search uses at most when asked for none in particular: each holds a batch of plans (a few hundred MB
at the oracle's CHUNK_PLANS), and past a handful the batches left per process are too few to share out evenly."""


def can_fork() -> bool:
    """Whether this process may fork workers: Linux (fork its default start method) and not a daemonic worker."""
    return (sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
            and not multiprocessing.current_process().daemon)


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, e.g. under a container's CPU set)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def usable_processes(requested: int | None) -> int:
    """Processes to use: `requested` (None: the available CPUs, at most MAX_SEARCH_PROCESSES); 1 where forking is
    not possible (`can_fork`)."""
    if not can_fork():
        return 1
    if requested is None:
        return min(available_cpus(), MAX_SEARCH_PROCESSES)
    return max(1, int(requested))


def run_forked(tasks: Sequence[Callable[[Callable[[Any], None]], T]],
               on_message: Callable[[Any], None] = lambda message: None) -> list[T]:
    """[task(send) for task in tasks], each task in a forked child process, their results in order. A task may call
    `send(message)` as it goes; the parent hands each message to `on_message` as it arrives. An exception in a child
    is raised here (the first one to arrive); the other children are then stopped."""
    context = multiprocessing.get_context("fork")
    _flush_standard_streams()      # else a child flushes its copy of what the parent had buffered: printed twice
    children: list = []
    readers: dict = {}
    try:
        for index, task in enumerate(tasks):
            reader, writer = context.Pipe(duplex=False)
            child = context.Process(target=_child_main, args=(task, writer), daemon=True)
            with warnings.catch_warnings():
                # Python 3.12+ warns on fork() in a process with threads; the children here run numpy only and
                # never take a lock another thread could hold (the module docstring)
                warnings.simplefilter("ignore", DeprecationWarning)
                child.start()
            writer.close()
            children.append(child)
            readers[reader] = index
        results: list = [None] * len(tasks)
        while readers:
            for reader in wait(list(readers)):
                index = readers[reader]
                try:
                    kind, value = reader.recv()
                except EOFError:
                    children[index].join()
                    raise _lost(index, len(tasks), children[index].exitcode) from None
                if kind == "message":
                    on_message(value)
                    continue
                del readers[reader]
                reader.close()
                if kind == "error":
                    raise value
                results[index] = value
        for child in children:
            child.join()
        return results
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
                child.join()
        for reader in readers:
            reader.close()


def _child_main(task: Callable[[Callable[[Any], None]], Any], writer) -> None:
    """A child's whole life: run the task, send its messages and then its result (or its exception)."""
    try:
        writer.send(("result", task(lambda message: writer.send(("message", message)))))
    except BaseException as error:       # handed to the parent, which raises it
        try:
            pickle.loads(pickle.dumps(error))          # the parent must be able to rebuild it
        except Exception:                # an exception that does not round-trip through pickle: its text
            error = RuntimeError(f"{type(error).__name__}: {error}")
        writer.send(("error", error))
    finally:
        writer.close()
        # out without the interpreter's exit (which flushes sys.stdout and sys.stderr): a stream another thread of
        # the parent was writing to at the fork has its lock held in this copy for good
        os._exit(0)


def _lost(index: int, count: int, exitcode: "int | None") -> Exception:
    """The error for a child that ended without a result: killed by SIGKILL (the kernel's out-of-memory killer, or
    a job's memory limit), a MemoryError as if this process had run out; anything else, a crash (a bug)."""
    if exitcode == -signal.SIGKILL:
        return MemoryError(f"search worker {index + 1} of {count} was killed (SIGKILL: out of memory?)")
    return RuntimeError(f"search worker {index + 1} of {count} ended without a result (exit code {exitcode}); "
                        "search in one process with --jobs 1 (jobs=1)")


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):      # closed, or a reader that left: nothing buffered to copy
            pass
