"""``experiment.store=s3://bucket/prefix``: a run folder kept on object storage (any fsspec URL).

The run writes into its local folder (``hydra.run.dir``) exactly as without a store; ``StoreMirror`` copies every
finished file to the store while the run goes and once more at its end. Each object is one PUT, which object
stores make atomic, and a pass puts the ``result.json`` files after every other file it found, so a reader of the
store never sees half a ``result.json``, nor a ``result.json`` whose task folder lacks files written before it.
Append-only ledgers (``*.jsonl``) are put up to their last complete line. The recorder's temporary files, the
tasks' workspaces (scratch) and the live control channel (``.control/``) stay local.

Readers (``inspect``, the report, ``verify``, replay, ``merge``) take the store's URL wherever they take a run
folder: ``local_run`` copies the store's objects into a local cache folder (only those that changed since the
last copy) and they read that as a run folder. A rerun with the same store (resume after a crash, on any machine)
first pulls the objects its local folder lacks (``RunStore.pull_missing``).

Credentials are read the standard way of the fsspec backend (for S3: ``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``,
``~/.aws``, ``FSSPEC_S3_*``); nothing of them is written to the run.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from flowllm.errors import CliError, ConfigError
from flowllm.rundir.control import CONTROL_DIR

__all__ = ["RunStore", "StoreMirror", "is_store_url", "local_run", "open_store"]

SYNC_INTERVAL_S = 2.0  # how often a running run's new files are put to the store
RESULT_NAME = "result.json"
# Kept locally only: a task's working directory (scratch), and the live control channel of the processes running
# the run (``flowllm ctl``: a pid, a pause) which means nothing to another machine or a later session.
SCRATCH_DIRS = frozenset({"workspace", CONTROL_DIR})
KEEP_LOCAL = frozenset({".hydra", CONTROL_DIR})  # a rerun keeps its own session's (the store's are the last one's)
PROBE_NAME = ".flowllm-store-probe"
# The store's check before the run: one attempt, a short connect timeout (by backend; others use their defaults).
FAIL_FAST: dict[str, dict[str, Any]] = {
    "s3": {"config_kwargs": {"connect_timeout": 5, "retries": {"max_attempts": 1}}},
}


def is_store_url(value: str | Path | None) -> bool:
    """Whether ``value`` names an object store rather than a local folder (``file://`` is a local folder)."""
    text = str(value or "")
    return "://" in text and not text.startswith("file://")


def _rel_paths(fs_paths: dict[str, Any], root: str) -> Iterator[tuple[str, dict[str, Any]]]:
    prefix = root.rstrip("/") + "/"
    for path, info in fs_paths.items():
        if info.get("type", "file") == "file" and path.startswith(prefix):
            yield path[len(prefix) :], info


def _version(info: dict[str, Any]) -> str:
    """What changes when an object is put again (its ETag on S3, else its size and modification time)."""
    stamp = info.get("ETag") or info.get("etag") or info.get("LastModified") or info.get("mtime") or ""
    return f"{info.get('size')}:{stamp}"


def _write_local(path: Path, data: bytes) -> None:
    """A downloaded object, replacing the local copy at once (a local reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


@dataclass(frozen=True)
class RunStore:
    """A run's prefix in an object store: the URL as given, its filesystem and the path within it."""

    url: str
    fs: Any  # fsspec.AbstractFileSystem (fsspec is the optional [s3] extra: imported when a store is used)
    root: str

    def key(self, rel: str) -> str:
        return f"{self.root}/{rel}"

    def check(self) -> None:
        """Put and remove a small object: the store answers and this process may write there."""
        try:
            self.fs.pipe_file(self.key(PROBE_NAME), b"ok")
            self.fs.rm_file(self.key(PROBE_NAME))
        except Exception as exc:  # any backend's failure (no route, no bucket, denied): one line naming the URL
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"experiment.store: cannot write to {self.url}: {reason}") from None

    def objects(self) -> dict[str, dict[str, Any]]:
        """The run's objects, by their path in the run folder, as the store holds them now: the filesystem's
        listings cache is dropped first (s3fs answers a prefix from the listing of its parent, so a run written
        since this store's earlier look would be missing or stale)."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.root, detail=True)
        except FileNotFoundError:
            return {}
        return {rel: info for rel, info in _rel_paths(found, self.root) if rel != PROBE_NAME}

    def put(self, blobs: dict[str, bytes]) -> None:
        if blobs:
            self.fs.pipe({self.key(rel): data for rel, data in blobs.items()})

    def remove(self, rels: list[str]) -> None:
        if rels:
            self.fs.rm([self.key(rel) for rel in rels])

    def fetch(self, rels: list[str], dest: Path) -> None:
        """These objects into ``dest`` (each replaced at once)."""
        if not rels:
            return
        found = self.fs.cat([self.key(rel) for rel in rels])
        for rel in rels:
            _write_local(dest / rel, found[self.key(rel)])

    def pull_missing(self, dest: Path) -> list[str]:
        """The store's objects that ``dest`` lacks, copied there (a rerun continues the store's run)."""
        rels = [rel for rel in self.objects() if rel.split("/", 1)[0] not in KEEP_LOCAL and not (dest / rel).exists()]
        self.fetch(rels, dest)
        return rels


def open_store(url: str, *, check: bool = True) -> RunStore:
    """The store at ``url`` (any fsspec URL; its backend must be installed), checked to accept writes."""
    try:
        from fsspec.core import url_to_fs
    except ImportError:
        raise ConfigError(f"experiment.store: {url} needs fsspec and its backend: pip install 'flowllm[s3]'") from None
    try:
        # A filesystem of its own, not fsspec's per-process instance: its credentials are the environment's now
        # (a cached client made before they were set, in a notebook or an earlier reader, would keep failing).
        fs, root = url_to_fs(url, skip_instance_cache=True)
    except (ImportError, ValueError) as exc:
        raise ConfigError(f"experiment.store: cannot open {url}: {str(exc).splitlines()[0]}") from None
    store = RunStore(url=url, fs=fs, root=str(root).rstrip("/"))
    if check:  # by a client that gives up at once: an unreachable store is said in seconds, not after retries
        probe, _ = url_to_fs(url, skip_instance_cache=True, **FAIL_FAST.get(fs.protocol[0], {}))
        RunStore(url=url, fs=probe, root=store.root).check()
    return store


def _complete(path: Path) -> bytes:
    """A file's content as a reader may see it: an append-only ``.jsonl`` up to its last complete line."""
    data = path.read_bytes()
    if path.suffix == ".jsonl" and data and not data.endswith(b"\n"):
        return data[: data.rfind(b"\n") + 1]
    return data


@dataclass
class StoreMirror:
    """Puts a run folder's new and changed files to the store, pass by pass, ``result.json`` files last."""

    store: RunStore
    run_dir: Path
    interval_s: float = SYNC_INTERVAL_S
    on_error: Callable[[str], None] | None = None
    _sent: dict[str, tuple[int, int]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _changed(self) -> Iterator[tuple[str, Path, tuple[int, int]]]:
        for folder, dirs, files in os.walk(self.run_dir):
            dirs[:] = sorted(d for d in dirs if d not in SCRATCH_DIRS)
            for name in sorted(files):
                if name.endswith(".tmp"):
                    continue
                path = Path(folder) / name
                try:
                    st = path.stat()
                except OSError:
                    continue
                rel = path.relative_to(self.run_dir).as_posix()
                stamp = (st.st_size, st.st_mtime_ns)
                if os.path.isfile(path) and self._sent.get(rel) != stamp:
                    yield rel, path, stamp

    def sync(self) -> int:
        """One pass: every file changed since the last pass; returns how many objects were put."""
        changed = list(self._changed())
        put = 0
        for last in (False, True):  # the result.json files after all the others of the pass
            group = [(rel, path, stamp) for rel, path, stamp in changed if (path.name == RESULT_NAME) is last]
            blobs: dict[str, bytes] = {}
            for rel, path, _ in group:
                try:
                    blobs[rel] = _complete(path)
                except OSError:
                    continue  # gone between the listing and the read (a resume's saved turns): next pass
            self.store.put(blobs)
            for rel, _, stamp in group:
                if rel in blobs:
                    self._sent[rel] = stamp
            put += len(blobs)
        gone = [rel for rel in self._sent if not (self.run_dir / rel).exists()]  # e.g. a finished task's .resume/
        self.store.remove(gone)
        for rel in gone:
            del self._sent[rel]
        return put

    def mark_present(self, rels: list[str]) -> None:
        """Files just pulled from the store: no need to put them back."""
        for rel in rels:
            st = (self.run_dir / rel).stat()
            self._sent[rel] = (st.st_size, st.st_mtime_ns)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync()
            except Exception as exc:  # a failed pass is retried by the next one; the final pass must succeed
                if self.on_error is not None:
                    self.on_error(f"experiment.store: could not put files to {self.store.url} yet: {exc}")

    def __enter__(self) -> StoreMirror:
        self._thread = threading.Thread(target=self._loop, name="flowllm-store", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.sync()  # the end of the run (or what an interrupted one left), whatever happened
        except Exception as error:  # the run's results are safe locally: say where, and how to finish
            if self.on_error is None:
                raise
            self.on_error(
                f"experiment.store: {self.store.url} lacks part of the run ({str(error).splitlines()[0]}); "
                f"it is complete in {self.run_dir}: rerun with the same experiment.store to finish the upload"
            )


def _cache_root() -> Path:
    base = os.environ.get("FLOWLLM_STORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "flowllm", "store"
    )
    return Path(base)


def local_run(value: str | Path, cache: Path | None = None) -> Path:
    """A run folder to read: ``value`` itself, or the store's run at ``value`` copied into a local cache folder
    (``$FLOWLLM_STORE_CACHE``, else ``~/.cache/flowllm/store``), only what changed since the last copy."""
    if not is_store_url(value):
        text = str(value)
        return Path(text.removeprefix("file://")).expanduser()
    url = str(value)
    try:
        store = open_store(url, check=False)
        objects = store.objects()
    except ConfigError as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:
        raise CliError(f"cannot read the run at {url}: {str(exc).splitlines()[0]}") from None
    if not objects:
        raise CliError(f"{url} holds no run (no object under it)")
    folder = (cache or _cache_root()) / hashlib.sha256(url.encode()).hexdigest()[:16]
    manifest_path = folder / "manifest.json"
    try:
        seen: dict[str, str] = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        seen = {}
    run_dir = folder / "run"
    stale = [rel for rel, info in objects.items() if seen.get(rel) != _version(info) or not (run_dir / rel).exists()]
    # result.json files last: a folder read while it is copied has no result.json without its task's files
    stale.sort(key=lambda rel: rel.rsplit("/", 1)[-1] == RESULT_NAME)
    store.fetch(stale, run_dir)
    seen.update({rel: _version(objects[rel]) for rel in stale})
    _write_local(manifest_path, json.dumps(seen).encode())
    return run_dir
