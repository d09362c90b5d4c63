"""Document readers in a process of their own, under a memory cap and a time budget.

markitdown's readers (pdfminer, openpyxl, python-docx...) parse untrusted files: a crafted PDF can spin for
minutes and a decompression bomb can take gigabytes. A thread cannot be stopped, so tool-files and tool-browse
run them in warm worker processes of their own (``ReaderProcess``): each one's address space is capped
(``RLIMIT_AS``), a call that overruns its budget gets the worker killed (and a new one started for the next
call), and either failure comes back as a ``DocumentError`` the model reads, never as a hung or dead server.
"""

from __future__ import annotations

import multiprocessing
import queue
import resource
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, TypeVar

from flowllm.tools.documents import DocumentError

T = TypeVar("T")


@dataclass(frozen=True)
class ReaderLimits:
    memory_mb: int = 1536  # the worker's whole address space; 0: no cap
    timeout_s: float = 45.0  # one document; stays below the pool's per-call timeout


def _cap_memory(memory_mb: int) -> None:
    if memory_mb > 0:
        size = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size, size))


class _Worker:
    """One capped worker process, started on first use and replaced after a call overran or crashed it."""

    def __init__(self, limits: ReaderLimits) -> None:
        self.limits = limits
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # forkserver: a clean process, not a fork of a threaded server.
            context = multiprocessing.get_context("forkserver")
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=context, initializer=_cap_memory, initargs=(self.limits.memory_mb,)
            )
        return self._pool

    def discard(self) -> None:
        """Kill the worker (a call overran its budget, or the worker died) so the next call gets a fresh one."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        future = self._executor().submit(function, *args, **kwargs)
        try:
            return future.result(timeout=self.limits.timeout_s)
        except FutureTimeout:
            self.discard()
            raise DocumentError(f"reading it took longer than {self.limits.timeout_s:g} s and was stopped") from None
        except MemoryError:
            raise DocumentError(
                f"reading it needs more than the reader's {self.limits.memory_mb:,} MB of memory"
            ) from None
        except BrokenProcessPool:
            self.discard()
            raise DocumentError("the document reader crashed on it (a corrupt or hostile file)") from None


class ReaderProcess:
    """Up to ``workers`` capped worker processes that run reader functions under ``limits``; thread-safe.

    A server shared by a run's tasks reads their documents concurrently, one per worker; a further call waits
    for a free worker. Workers start on first use, so a server that reads no document starts none.
    """

    def __init__(self, limits: ReaderLimits | None = None, workers: int = 1) -> None:
        self.limits = limits or ReaderLimits()
        self._workers = [_Worker(self.limits) for _ in range(max(1, workers))]
        self._free: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        for worker in self._workers:
            self._free.put(worker)

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        worker = self._free.get()
        try:
            return worker.run(function, *args, **kwargs)
        finally:
            self._free.put(worker)

    def close(self) -> None:
        for worker in self._workers:
            worker.discard()
