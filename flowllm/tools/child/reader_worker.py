"""The isolated document reader's worker, run inside bubblewrap (see ``flowllm.tools.web.readerproc``).

Run as ``python -P -s -X utf8 -c <program("reader_worker")> <config JSON>``. It sets itself up with the
standard library alone (no flowllm import before the uid is dropped and the limits are set), imports the
readers once, says it is ready, then serves requests until the server closes its stdin. Frames both ways are
an 8-byte big-endian length and the payload: requests are pickles of ``(function, args, kwargs)`` (the worker
trusts the server), replies are JSON (the server trusts nothing the worker sends).
"""

import ctypes
import importlib
import json
import os
import pickle
import resource
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # joined ahead of this text by flowllm.tools.child.program
    from flowllm.tools.child.limits import set_limit

PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522
CHUNK = 1048576
REFUSED_EXIT = 126


def setup(cfg: dict[str, Any]) -> tuple[int, int]:
    """Drop to the sandbox uid, set no-new-privs and the limits; the protocol's (requests, replies) fds."""
    libc = ctypes.CDLL(None, use_errno=True)
    for name in set(os.environ) - set(cfg["env"]):  # PWD, which bwrap sets for --chdir
        del os.environ[name]
    # The protocol's pipes move to descriptors of their own; fd 0 reads nothing and fd 1 goes to stderr, so a
    # library that prints (or reads stdin) cannot corrupt the conversation.
    requests, replies = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    uid = cfg["uid"]
    if uid is not None:
        # As root (no user namespace: one would map the worker's uid to root outside), become the server's
        # sandbox uid; bwrap left us only the capabilities to do so, and the change clears them.
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        # The change emptied the permitted and effective sets; the inheritable one still names the two
        # capabilities bwrap kept. no-new-privs makes them useless, and cleared they are not even there.
        header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)  # this process
        sets = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable; twice (capabilities 0-31, 32-63)
        if libc.capget(header, sets) == 0:
            sets[2] = sets[5] = 0
            libc.capset(header, sets)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:  # no setuid binary gives privileges back
        os._exit(REFUSED_EXIT)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL))  # a change of credentials clears it
    if cfg["memory_mb"] > 0:
        set_limit(resource.RLIMIT_AS, cfg["memory_mb"] * 1024 * 1024)
    set_limit(resource.RLIMIT_FSIZE, cfg["fsize"])
    if os.getuid() != 0:  # root is exempt from the process cap, so it means nothing there
        set_limit(resource.RLIMIT_NPROC, cfg["nproc"])
    set_limit(resource.RLIMIT_CORE, 0)
    return requests, replies


def warm() -> None:
    # Once, at start: the first document should not pay for markitdown's import (pandas, pdfminer, ...).
    try:
        for name in ("flowllm.tools.web.documents", "markitdown.converters"):
            importlib.import_module(name)
    except Exception:
        pass  # under a tiny memory cap, or without markitdown: the call that needs it says why


def encode(obj: object) -> bytes:
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "surrogatepass")  # lone surrogates kept too


def send(replies: int, data: bytes) -> None:
    for part in (len(data).to_bytes(8, "big"), data):
        view = memoryview(part)
        while view:
            view = view[os.write(replies, view[:CHUNK]) :]


def receive(requests: int, size: int) -> bytes:
    buf = bytearray()
    while len(buf) < size:
        chunk = os.read(requests, min(size - len(buf), CHUNK))
        if not chunk:
            os._exit(0)  # the server closed the pipe: it is done with us
        buf += chunk
    return bytes(buf)


def is_document_error(exc: BaseException) -> bool:
    return any(
        c.__name__ == "DocumentError" and c.__module__ == "flowllm.tools.web.documents" for c in type(exc).__mro__
    )


def failure(exc: BaseException) -> bytes:
    try:
        if is_document_error(exc):
            return encode({"error": "document", "message": str(exc)})
        return encode({"error": "failed", "message": f"{type(exc).__name__}: {exc}"})
    except MemoryError:
        return encode({"error": "memory"})
    except Exception:  # an exception whose text cannot be had
        return encode({"error": "failed", "message": type(exc).__name__})


def serve(requests: int, replies: int) -> None:
    while True:
        payload = receive(requests, int.from_bytes(receive(requests, 8), "big"))
        try:
            function, args, kwargs = pickle.loads(payload)
            del payload
            data = encode({"ok": function(*args, **kwargs)})  # a value JSON cannot carry fails here
        except MemoryError:
            data = encode({"error": "memory"})
        except Exception as exc:
            data = failure(exc)
        send(replies, data)
        del data


def main(cfg: dict[str, Any]) -> None:
    requests, replies = setup(cfg)
    warm()
    send(replies, encode({"ready": True, "uid": os.getuid()}))
    serve(requests, replies)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
