"""One run_python call: the limits it runs under and what it gave back (the text the model reads)."""

from __future__ import annotations

import enum
import signal
from collections import deque
from dataclasses import dataclass, field

from flowllm.tools.child.sandbox_boot import REFUSED_EXIT  # the bootstrap's status when it refuses to run


class Isolation(enum.Enum):
    """How hard ``run_python`` insists on its isolation."""

    BEST = "best"  # isolate as far as this machine allows; say once what is missing
    REQUIRED = "required"  # refuse to run code when any part is missing


class SandboxBackend(enum.Enum):
    """What builds the sandbox (``--sandbox-backend``)."""

    # As root: our own namespaces (the stronger choice: a uid of the server's own and a cgroup). Not root:
    # bubblewrap where it works here, else the fallback with its gaps.
    AUTO = "auto"
    # bubblewrap, as root too; where it cannot run, the fallback runs and the result reports the gap "bwrap".
    BWRAP = "bwrap"
    # Our own namespaces as root; not root, the fallback (no private filesystem, no PID namespace).
    NAMESPACES = "namespaces"


@dataclass
class SandboxLimits:
    """Limits of one ``run_python`` call; ``0`` switches a resource limit off."""

    timeout_s: float = 30.0
    memory_mb: int = 2048  # per process (RLIMIT_AS) and, where a cgroup can be made, for all of them together
    max_file_mb: int = 512  # largest single file (RLIMIT_FSIZE); also the private /tmp's size
    max_workspace_mb: int = 1024  # what the workspace may grow to during a call before the code is stopped
    max_processes: int = 64  # processes and threads of the code together
    allow_network: bool = False
    isolation: Isolation = Isolation.BEST
    backend: SandboxBackend = SandboxBackend.AUTO
    # How much of each stream is kept: the first two thirds and the last third of this many bytes.
    max_stdout_chars: int = 20000
    max_stderr_chars: int = 8000


class StreamCapture:
    """Keeps the head and the tail of a stream and counts what falls in between."""

    def __init__(self, limit: int) -> None:
        self.head_limit = max(0, limit * 2 // 3)
        self.tail_limit = max(0, limit - self.head_limit)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_size = 0
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk or self.tail_limit == 0:
            return
        self.tail.append(chunk)
        self.tail_size += len(chunk)
        while self.tail and self.tail_size - len(self.tail[0]) >= self.tail_limit:
            self.tail_size -= len(self.tail.popleft())

    def text(self) -> tuple[str, int]:
        """The kept text and how many bytes were cut from the middle."""
        tail = b"".join(self.tail)
        if len(tail) > self.tail_limit:
            tail = tail[len(tail) - self.tail_limit :]
        cut = self.total - len(self.head) - len(tail)
        head_text = self.head.decode("utf-8", errors="replace")
        tail_text = tail.decode("utf-8", errors="replace")
        if cut <= 0:
            return head_text + tail_text, 0
        return f"{head_text}\n[... {cut:,} bytes of output cut ...]\n{tail_text}", cut


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed on timeout; negative: killed by that signal
    timed_out: bool = False
    stdout_cut: int = 0
    stderr_cut: int = 0
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    workspace_exceeded: bool = False
    # What the bootstrap could not set up on this machine (keys of GAP_TEXT); None if it did not say.
    gaps: list[str] | None = None
    # What built the sandbox of this call: BWRAP or NAMESPACES (the latter also names the fallback), never AUTO.
    backend: SandboxBackend | None = None

    @property
    def ok(self) -> bool:
        return not self.timed_out and self.exit_code == 0

    def render(self) -> str:
        """The text the model sees: stdout, then stderr and a status line when there is something to say."""
        parts: list[str] = []
        if self.stdout:
            parts.append(self.stdout.rstrip("\n"))
        if self.stderr.strip():
            parts.append("[stderr]\n" + self.stderr.rstrip("\n"))
        status = self._status()
        if status:
            parts.append(status)
        if not parts:
            return "(no output: the code ran without printing anything; use print() to show results)"
        return "\n".join(parts)

    def _status(self) -> str:
        lim = self.limits
        if self.workspace_exceeded:
            return (
                f"[stopped: the task folder grew past {lim.max_workspace_mb} MB; "
                "delete what is not needed or write less]"
            )
        if self.timed_out:
            return (
                f"[timed out: the code was still running after {lim.timeout_s:g} s and was stopped; "
                "output printed before that is shown above]"
            )
        code = self.exit_code
        if code is None or code == 0:
            return ""
        if code == REFUSED_EXIT and self.gaps:
            return "[not run: the sandbox's isolation is required but missing here: " + ", ".join(self.gaps) + "]"
        if code < 0:
            sig = -code
            if sig == signal.SIGXCPU:
                return f"[stopped: the CPU time limit ({cpu_seconds(lim)} s) was reached]"
            if sig == signal.SIGXFSZ:
                return f"[stopped: a file reached the size limit of {lim.max_file_mb} MB]"
            if sig == signal.SIGKILL and lim.memory_mb:
                return f"[killed (signal SIGKILL): possibly over the memory limit of {lim.memory_mb} MB]"
            try:
                name = signal.Signals(sig).name
            except ValueError:
                name = str(sig)
            return f"[killed by signal {name}]"
        if "MemoryError" in self.stderr[-2000:] and lim.memory_mb:
            return f"[exit status {code}: the code ran out of memory; the limit is {lim.memory_mb} MB]"
        return f"[exit status {code}]"


def cpu_seconds(limits: SandboxLimits) -> int:
    # The CPU limit is only a backstop for the wall clock (a busy loop in threads could outrun it otherwise).
    return int(limits.timeout_s) + 5 if limits.timeout_s > 0 else 0
