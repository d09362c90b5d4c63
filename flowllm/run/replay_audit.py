"""Whether a replayed task really replayed: every node's output compared with the saved run's.

Replay serves each turn's saved model reply. That is only the old run again as long as everything before the
reply is the same: once a node produces something else (another parser finds another call, a stricter repair
fails an argument, a tool returns another result), the next saved reply answers a conversation that no longer
exists, and the task's score says nothing about the new pipeline. The audit finds the first such node.

    exact       every node of every turn produced byte-for-byte what the saved run recorded
    diverged    a node produced something else: the turn, the node and what changed are kept
    missing     the new pipeline asked for a reply the saved run never had (the task failed)
    unverified  the saved run kept no record to compare with (recorder.snapshot=errors or none)
    forked      (provider.fork=live) the task went live at a turn whose request differed: the rest of it is
                a live run (flowllm/providers/fork.py)

Only exact and forked tasks are scored: a diverged task's saved replies answered a conversation that never
happened, a missing one has no answer, an unverified one may have diverged unseen; their ``correct`` is null.
``summary.json`` counts each and scores accuracy on the scored tasks only.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from flowllm.engine import BoundNode, TurnContext
from flowllm.engine.blobs import BlobStore
from flowllm.engine.recorder import unmasked_record
from flowllm.engine.runners import NodeObserver
from flowllm.providers.fork import ForkLog
from flowllm.providers.replay import SavedKey, read_saved
from flowllm.rundir.digests import Digests, digest, node_key, read_digests
from flowllm.rundir.epochs import current_epoch
from flowllm.rundir.jsondiff import first_difference
from flowllm.rundir.layout import NODE_RE, OUTPUT_FILE, RunLayout, TurnDirs
from flowllm.scoring.tally import SCORED_REPLAYS, replay_scored

# What a difference is shown as, at most: enough to see what changed.
DESCRIBE_CHARS = 200
_NOT_READ = object()  # a task whose saved digests were not looked for yet
_NO_SUCH_NODE = object()  # the saved turn has no record of a node of that name: its pipeline had none


class ReplayStatus(StrEnum):
    EXACT = "exact"
    DIVERGED = "diverged"
    MISSING = "missing"
    UNVERIFIED = "unverified"
    FORKED = "forked"


# The verdicts whose task result is the new pipeline's own: every model reply answered the request it was given
# (the rule is flowllm/scoring/tally.py's, read by the tally, the statistics and the paired comparisons alike).
SCORED = SCORED_REPLAYS
is_scored = replay_scored


@dataclass(frozen=True)
class Divergence:
    """The first node of a task whose output differs from the saved run's."""

    turn: int
    node: str
    scope: str
    what: str

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"turn": self.turn, "node": self.node, "what": self.what}
        if self.scope:
            out["scope"] = self.scope
        return out


class ReplayAudit:
    """A node observer in front of the recorder: records as usual, then compares with the saved run."""

    records_nodes = True  # it must see every node, whatever the recorder keeps

    def __init__(
        self,
        source: RunLayout,
        dumps: Callable[[Any], bytes],
        recorder: NodeObserver | None = None,
        *,
        forks: ForkLog | None = None,
        saved_outputs: Callable[[SavedKey], bytes | None] | None = None,
    ) -> None:
        self.source = source
        # The saved outputs the provider already read, by node (ReplayProvider.saved_output): read once per turn.
        self._saved_outputs = saved_outputs
        self.forks = forks  # a fork's record of where each task went live (None: a plain replay)
        self.dumps = dumps
        self.recorder = recorder
        self._forward = recorder is not None and recorder.records_nodes
        # The comparison needs a node's outputs only: its meta is built just for a recorder that keeps it.
        self.reads_meta = self._forward and recorder is not None and recorder.reads_meta
        self._first: dict[str, Divergence] = {}
        self._unverified: set[str] = set()
        self._lock = threading.Lock()
        self._turn_dirs = TurnDirs(source)  # each turn's saved folder is spelled once, not once per node
        # The saved run's digests.json of each task (or epoch) being replayed, read once, dropped at its verdict.
        self._digests: dict[tuple[str, int | None], Digests | None] = {}
        # Records hold media as blob references (engine/blobs.py): compare the new outputs in the same form.
        self._references = BlobStore(source.root, None)

    def on_node(
        self,
        ctx: TurnContext,
        node: BoundNode,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, Any] | None,
        meta: dict[str, Any],
    ) -> None:
        if self._forward:
            assert self.recorder is not None
            self.recorder.on_node(ctx, node, inputs, outputs, meta)
        epoch = current_epoch()
        # What the provider kept of this node's saved record (the call node's), taken whatever happens next.
        saved = (
            self._saved_outputs((ctx.task_id, ctx.scope, epoch, ctx.turn, node.folder))
            if self._saved_outputs is not None
            else None
        )
        if outputs is None or ctx.task_id in self._first:
            return  # a failed node is judged by the task's error; after the first divergence the rest follows
        produced = outputs if type(outputs) is dict else dict(outputs)
        if saved is None:
            if self._matches_digest(ctx, node, produced, epoch):
                return  # what the saved run's digests.json says it recorded: no file to read
            try:
                saved = read_saved(self._saved_path(ctx, node, epoch))
            except OSError:
                saved = self._renumbered(ctx, node, epoch)
            if saved is None or saved is _NO_SUCH_NODE:
                with self._lock:
                    if saved is None:
                        self._unverified.add(ctx.task_id)
                    else:
                        what = f"the saved run has no {node.name} node"
                        self._first.setdefault(ctx.task_id, Divergence(ctx.turn, node.name, ctx.scope, what))
                return
        # The common case first: the plain serialisation already equals the saved record, which was masked and
        # had its media moved to blobs when it was written, so those steps have nothing left to change.
        if saved == unmasked_record(produced):
            return
        new = self._references.serialize(produced, self.dumps)
        if saved == new:
            return
        what = "the output differs"
        try:
            diff = first_difference(orjson.loads(saved), orjson.loads(new))
            if diff is not None:
                what = diff.describe(DESCRIBE_CHARS)
        except orjson.JSONDecodeError:
            what = "the saved output.json is unreadable"
        with self._lock:
            self._first.setdefault(ctx.task_id, Divergence(ctx.turn, node.name, ctx.scope, what))

    def _matches_digest(self, ctx: TurnContext, node: BoundNode, produced: dict[str, Any], epoch: int | None) -> bool:
        """Whether the output has the digest the saved run wrote for this node (as recorded, or once masked and
        its media moved to blobs). False when there is none, or it differs: the file then decides."""
        key = (ctx.task_id, epoch)
        found = self._digests.get(key, _NOT_READ)  # one dict read: atomic, no lock needed to look
        if found is _NOT_READ:
            found = read_digests(self.source.records(*key))
            with self._lock:
                self._digests[key] = found
        if not isinstance(found, Digests):
            return False
        known = found.outputs.get(node_key(ctx.turn, node.folder, ctx.scope))
        if known is None:
            return False
        return (
            digest(unmasked_record(produced)) == known
            or digest(self._references.serialize(produced, self.dumps)) == known
        )

    def _renumbered(self, ctx: TurnContext, node: BoundNode, epoch: int | None) -> Any:
        """The saved record of the node found by its name, when the saved run numbered it differently (a hook
        switched on or off puts a node before it); ``_NO_SUCH_NODE`` when the saved turn recorded its nodes'
        outputs and none of them is this one; None when the saved run kept nothing to tell (unverified)."""
        turn_dir = self._turn_dirs.turn(ctx.task_id, ctx.turn, ctx.scope, epoch)
        try:
            with os.scandir(turn_dir) as entries:
                folders = {found.group(2): e.path for e in entries if (found := NODE_RE.match(e.name)) and e.is_dir()}
            if node.name in folders:
                return read_saved(os.path.join(folders[node.name], OUTPUT_FILE))
        except OSError:
            return None
        recorded = any(os.path.isfile(os.path.join(folder, OUTPUT_FILE)) for folder in folders.values())
        return _NO_SUCH_NODE if recorded else None

    def _saved_path(self, ctx: TurnContext, node: BoundNode, epoch: int | None) -> str:
        return self._turn_dirs.node_file(ctx.task_id, ctx.turn, node.index, node.name, OUTPUT_FILE, ctx.scope, epoch)

    def forget(self, task_id: str) -> None:
        """A new attempt at the task starts from a clean slate."""
        with self._lock:
            self._first.pop(task_id, None)
            self._unverified.discard(task_id)
        if self.forks is not None:
            self.forks.forget(task_id)

    def verdict(self, task_id: str, *, missed: bool) -> dict[str, Any]:
        """What ``result.json`` says under ``replay``."""
        with self._lock:
            first = self._first.get(task_id)
            unverified = task_id in self._unverified
            self._digests.pop((task_id, current_epoch()), None)
        if missed:
            return {"status": ReplayStatus.MISSING.value}
        if self.forks is not None:
            return self._fork_verdict(task_id, first, unverified)
        if first is not None:
            return {"status": ReplayStatus.DIVERGED.value, **first.to_dict()}
        if unverified:
            return {"status": ReplayStatus.UNVERIFIED.value}
        return {"status": ReplayStatus.EXACT.value}

    def _fork_verdict(self, task_id: str, first: Divergence | None, unverified: bool) -> dict[str, Any]:
        assert self.forks is not None
        point = self.forks.point(task_id)
        calls, usage = self.forks.live(task_id)
        live = {"live_calls": calls, "live_usage": usage.to_dict()}
        divergence = {"divergence": first.to_dict()} if first is not None else {}
        if point is not None:
            return {"status": ReplayStatus.FORKED.value, **point.to_dict(), **divergence, **live}
        if first is not None:
            # A node produced something else, and no request after it differed from the saved run's (no call
            # followed, or the change never reached a request): every reply answered the very request it was
            # written for, so the result is the new pipeline's, with nothing left to call live.
            return {
                "status": ReplayStatus.FORKED.value,
                "turn": None,
                "reason": "no request after the divergence differed from the saved run's: saved replies answered them",
                **divergence,
                **live,
            }
        if unverified:
            return {"status": ReplayStatus.UNVERIFIED.value, **live}
        return {"status": ReplayStatus.EXACT.value, **live}


# How to learn a change's effect on the tasks a replay could not score: go live where they part from the saved run.
FORK_HINT = "provider.fork=live"


def effect_not_known(unknown: int, scored: int) -> str | None:
    """What a replay's headline must say when some tasks did not replay (diverged, missing, unverified): the
    accuracy is over the ``scored`` others only, and the change's effect on the ``unknown`` is not known. None:
    every task scored."""
    if not unknown:
        return None
    total = unknown + scored
    return (
        f"the change's effect on {unknown} of {total} tasks is not known (they did not replay exactly): "
        f"rerun with {FORK_HINT} to score them live"
    )


def judged(verdicts: Iterable[tuple[dict[str, Any] | None, bool | None]]) -> tuple[int, int]:
    """The denominators of a replay's two accuracies: the exact replays, and the scored (exact and forked) tasks,
    that have a verdict. A task with no verdict (no ground truth) replays all the same, but counts in neither."""
    exact = scored = 0
    for verdict, correct in verdicts:
        status = (verdict or {}).get("status", ReplayStatus.UNVERIFIED.value)
        if correct is not None:
            exact += status == ReplayStatus.EXACT.value
            scored += status in SCORED
    return exact, scored


def replay_summary(verdicts: list[tuple[dict[str, Any] | None, bool | None]]) -> dict[str, Any] | None:
    """Counts by replay status and accuracy on the scored (exact and forked) tasks; ``verdicts`` is (replay,
    correct) per task. None when the run was not a replay."""
    if not any(v is not None for v, _ in verdicts):
        return None
    counts = {status.value: 0 for status in ReplayStatus}
    exact_correct = scored_correct = 0
    live_calls = 0
    for verdict, correct in verdicts:
        status = (verdict or {}).get("status", ReplayStatus.UNVERIFIED.value)
        counts[status] = counts.get(status, 0) + 1
        live_calls += int((verdict or {}).get("live_calls") or 0)
        if status == ReplayStatus.EXACT.value and correct:
            exact_correct += 1
        if status in SCORED and correct:
            scored_correct += 1
    exact = counts[ReplayStatus.EXACT.value]
    scored = exact + counts[ReplayStatus.FORKED.value]
    exact_judged, scored_judged = judged(verdicts)
    out: dict[str, Any] = {
        **counts,
        "exact_correct": exact_correct,
        # The score of the new pipeline is known only where every reply answered the request it was given.
        "accuracy_exact": round(exact_correct / exact_judged, 4) if exact_judged else None,
        "scored": scored,
        "unscored": len(verdicts) - scored,
        "scored_correct": scored_correct,
        "accuracy_scored": round(scored_correct / scored_judged, 4) if scored_judged else None,
        "live_calls": live_calls,
    }
    out["effect_not_known"] = effect_not_known(len(verdicts) - scored, scored)
    return out
