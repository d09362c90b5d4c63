"""Document readers in a process of their own, under a memory cap and a time budget.

markitdown's readers (pdfminer, openpyxl, python-docx...) parse untrusted files: a crafted PDF can spin for
minutes and a decompression bomb can take gigabytes. A thread cannot be stopped, so tool-files and tool-browse
run them in one warm worker process per server (``ReaderProcess``): its address space is capped
(``RLIMIT_AS``), a call that overruns its budget gets the worker killed (and a new one started for the next
call), and either failure comes back as a ``DocumentError`` the model reads, never as a hung or dead server.
"""

from __future__ import annotations

import multiprocessing
import resource
import threading
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


class ReaderProcess:
    """One worker process that runs reader functions under ``limits``; thread-safe, one call at a time."""

    def __init__(self, limits: ReaderLimits | None = None) -> None:
        self.limits = limits or ReaderLimits()
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            # forkserver: a clean process, not a fork of a threaded server.
            context = multiprocessing.get_context("forkserver")
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=context, initializer=_cap_memory, initargs=(self.limits.memory_mb,)
            )
        return self._pool

    def _discard(self) -> None:
        """Kill the worker (a call overran its budget, or the worker died) so the next call gets a fresh one."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)

    def run(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        with self._lock:
            future = self._executor().submit(function, *args, **kwargs)
            try:
                return future.result(timeout=self.limits.timeout_s)
            except FutureTimeout:
                self._discard()
                raise DocumentError(
                    f"reading it took longer than {self.limits.timeout_s:g} s and was stopped"
                ) from None
            except MemoryError:
                raise DocumentError(
                    f"reading it needs more than the reader's {self.limits.memory_mb:,} MB of memory"
                ) from None
            except BrokenProcessPool:
                self._discard()
                raise DocumentError("the document reader crashed on it (a corrupt or hostile file)") from None

    def close(self) -> None:
        with self._lock:
            self._discard()
