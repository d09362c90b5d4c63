"""The resilient provider: retries, key pools, fallback chains with circuit breakers, and the usage ledger,
behind the same ``Provider`` contract as a single SDK provider.

    send(request, context)
      chain = the agent's chain (provider.agent_models) or the main one: primary, then provider.fallbacks
      for each provider of the chain:
          attempts, driven by the retry policy (at most retry.max_attempts per call and provider, in all):
              breaker.admit()                      (refused: skip it, ledger: one skip line per call)
              limiter.acquire()                    (client-side rate limit, shared by every task)
              key = key_pool.acquire()             (round robin; waits for a resting key, within limits)
              raw = sdk_provider.send(request)     (the request rebuilt for this provider if it is not the
                                                    primary: another protocol, model or max_tokens)
              reply checked with normalize         (an empty or unreadable reply is a failed attempt too)
              ledger: attempt line; key pool, breaker, limiter told of the outcome
          answered -> the raw reply, tagged with who answered (``flowllm_route``)
          failed   -> the next provider, unless the error is the request's fault (400, context length)
      nobody answered, but a breaker that refused (or opened on this call's failure) may recover:
          sleep until it admits again (its recovery timer, or its half-open trial's end; no polling), within
          the primary's retry.max_total_s, then go round again.

``normalize(raw)`` reads the tag and lets the provider that answered read its own reply.
``asyncio.CancelledError`` is never caught: it goes through retries, waits and fallbacks untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from tenacity import RetryCallState

from flowllm.config.provider_schema import ProviderConfig
from flowllm.core.forwarding import ProviderFacade
from flowllm.core.interfaces import CallContext
from flowllm.core.types import Block, Message, ModelResponse, ToolSpec, Usage
from flowllm.providers.base import BaseProvider
from flowllm.providers.batch import BATCH_KEY
from flowllm.providers.breaker import CircuitBreaker, Permit, Transition
from flowllm.providers.errors import ProviderCallError, ProviderResponseError
from flowllm.providers.keys import RETIRE_KINDS, KeyPool, KeySlot, NoUsableKeyError
from flowllm.providers.ledger import UsageLedger
from flowllm.providers.limiter import Limiter, Slot, Unlimited
from flowllm.providers.registry import MAIN_AGENT, RoutePlan
from flowllm.providers.retry import RetryPolicy
from flowllm.rundir.results import LedgerLine

log = logging.getLogger(__name__)

ROUTE_KEY = "flowllm_route"
# Errors that are the request's own fault: another provider would refuse it too, so no fallback.
NO_FALLBACK_KINDS = frozenset({"bad_request", "context_length"})
OVERLOAD_KINDS = frozenset({"rate_limit", "overloaded"})  # answers that say: fewer calls at once (adaptive limit)


def estimate_tokens(wire: dict[str, Any]) -> int:
    """A request's input tokens before it is sent (about 4 bytes of JSON a token), for tokens_per_minute."""
    return len(orjson.dumps(wire, default=str)) // 4


class WireRequest(dict[str, Any]):
    """A wire request that remembers the canonical prompt it was built from, so a fallback provider with
    another protocol can build its own. It is still a plain dict to everything else (orjson writes it as
    one); a request read back from disk has no canonical prompt and only falls back within its protocol."""

    canonical: tuple[list[Block], list[Message], list[ToolSpec]] | None = None


class CheckedReply(dict[str, Any]):
    """A raw reply normalised inside the send (for its bill, and to retry an unusable one): that ModelResponse is
    handed to the first ``normalize`` of this reply, so a reply is read once per call, not twice. Still a plain
    dict to everything else (the recorder writes it as one); a later ``normalize`` reads it again."""

    def __init__(self, raw: dict[str, Any], checked: ModelResponse) -> None:
        super().__init__(raw)
        self._checked: ModelResponse | None = checked

    def take(self) -> ModelResponse | None:
        checked, self._checked = self._checked, None
        return checked


@dataclass
class Route:
    """One provider of a chain, open: an SDK provider per key, the key pool, the breaker, the policy."""

    id: str
    cfg: ProviderConfig
    providers: dict[str, BaseProvider]  # key label -> provider using that key
    pool: KeyPool
    breaker: CircuitBreaker
    policy: RetryPolicy
    limiter: Limiter = field(default_factory=Unlimited)

    @property
    def any_provider(self) -> BaseProvider:
        return next(iter(self.providers.values()))

    @property
    def protocol(self) -> str:
        return self.cfg.protocol


@dataclass(frozen=True)
class _Sent:
    """One attempt as it went out: the key it used, when, and how long the rate limit held it first."""

    key: str
    started_wall: float
    started: float
    limiter_wait_s: float


class _Attempts:
    """The state one provider's attempts share with the retry policy's callbacks."""

    def __init__(self) -> None:
        self.number = 0
        self.slot: KeySlot | None = None
        self.last_error: ProviderCallError | None = None


class _BreakerRefused(Exception):
    """The provider's breaker refused an attempt before anything was sent (carries the failure before it)."""

    def __init__(self, last_error: ProviderCallError | None) -> None:
        super().__init__("circuit open")
        self.last_error = last_error


@dataclass
class _Call:
    """One ``send``: its ledger id, the providers' attempts so far, what failed, time spent waiting."""

    id: int
    context: CallContext
    used: dict[str, int] = field(default_factory=dict)  # provider id -> attempts made
    done: set[str] = field(default_factory=set)  # providers this call will not try again
    failures: list[tuple[str, ProviderCallError]] = field(default_factory=list)
    skipped: set[tuple[str, str]] = field(default_factory=set)  # (provider, reason) already in the ledger
    breaker_wait_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)
    sending_s: float = 0.0  # the attempts' own latencies; the rest of the call's time was spent waiting

    def fail(self, provider: str, error: ProviderCallError) -> None:
        """Remember ``provider``'s latest failure (one entry per provider, in the order they first failed)."""
        self.failures[:] = [(p, e) if p != provider else (p, error) for p, e in self.failures]
        if all(p != provider for p, _ in self.failures):
            self.failures.append((provider, error))


class ResilientProvider(ProviderFacade):
    """A ``Provider`` made of routes (see the module doc). Built by ``open_provider``. It declares what its
    primary provider declares (``accepted_media`` included): a request is built for the primary, so a medium
    the primary does not take is described in text before any provider of the chain sees it."""

    def __init__(
        self,
        plan: RoutePlan,
        routes: dict[str, Route],
        *,
        ledger: UsageLedger | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self.plan = plan
        self.routes = routes
        self.ledger = ledger or UsageLedger(None)
        self.clock = clock
        self.sleep = sleep
        self.chains: dict[str, list[Route]] = {agent: [routes[i] for i in ids] for agent, ids in plan.chains.items()}
        self.primary = self.chains[MAIN_AGENT][0]
        self.adopt(self.primary.any_provider)

    # ----- the Provider contract -------------------------------------------------------------------------
    def build_request(self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        request = WireRequest(self.primary.any_provider.build_request(system=system, messages=messages, tools=tools))
        request.canonical = (system, messages, tools)
        return request

    def normalize(self, raw: dict[str, Any]) -> ModelResponse:
        if type(raw) is CheckedReply:
            checked = raw.take()
            if checked is not None:  # read once already, when the attempt checked the reply
                return checked
        route = self.routes.get(str((raw.get(ROUTE_KEY) or {}).get("provider", self.primary.id)), self.primary)
        return route.any_provider.normalize(raw)

    async def aclose(self) -> None:
        for route in self.routes.values():
            for provider in route.providers.values():
                await provider.aclose()

    # ----- sending ---------------------------------------------------------------------------------------
    def _request_for(self, route: Route, request: dict[str, Any]) -> dict[str, Any] | None:
        """``request`` as ``route`` must receive it; None when it cannot be rebuilt for that route."""
        if route is self.primary:
            return request
        canonical = request.canonical if isinstance(request, WireRequest) else None
        if canonical is not None:
            system, messages, tools = canonical
            return route.any_provider.build_request(system=system, messages=messages, tools=tools)
        if route.protocol == self.primary.protocol:
            return {**request, "model": route.cfg.model}
        return None

    async def send(self, request: dict[str, Any], *, context: CallContext) -> dict[str, Any]:
        chain = self.chains.get(context.agent) or self.chains[MAIN_AGENT]
        call = _Call(self.ledger.next_call_id(), context)
        deadline = self.clock() + self.primary.policy.max_total_s
        while True:
            # Providers refused by their breaker (or failed while it opened) with attempts left: worth
            # waiting for when nobody else answers.
            blocked: list[Route] = []
            for position, route in enumerate(chain):
                if route.id in call.done or call.used.get(route.id, 0) >= route.policy.max_attempts:
                    continue
                wire = self._request_for(route, request)
                if wire is None:
                    self._skip(route, call, "request_not_portable")
                    call.done.add(route.id)
                    continue
                try:
                    raw = await self._attempts(route, wire, call, fallback=position > 0)
                except _BreakerRefused as refused:
                    if refused.last_error is not None:
                        call.fail(route.id, refused.last_error)
                    self._skip(route, call, "breaker_open")
                    blocked.append(route)
                    continue
                except ProviderCallError as error:
                    call.fail(route.id, error)
                    if isinstance(error, NoUsableKeyError):
                        self._skip(route, call, "no_usable_key")
                        call.done.add(route.id)
                        continue
                    if error.kind in NO_FALLBACK_KINDS:
                        self._end(call, None, error)
                        raise
                    if self._may_recover(route, error, call):
                        blocked.append(route)
                    else:
                        call.done.add(route.id)
                    continue
                raw[ROUTE_KEY] = {
                    "provider": route.id,
                    "protocol": route.protocol,
                    "model": route.cfg.model,
                    "fallback": position > 0,
                    # No call number here: it depends on how concurrent tasks interleave, and the raw reply is
                    # recorded in output.json, which must not change between runs. usage.jsonl has it.
                }
                if wire is not request:
                    raw[ROUTE_KEY]["request"] = dict(wire)  # what was really sent, next to the primary's request
                self._end(call, route, None, fallback=position > 0)
                return raw
            # Nobody answered. A provider whose breaker is open (or half-open with its trial out) may be back
            # soon: sleep until it admits a call again, within retry.max_total_s, rather than fail the task.
            if blocked:
                started = self.clock()
                if await self._wait_for_breakers(blocked, deadline - started):
                    call.breaker_wait_s += self.clock() - started
                    continue
            break
        final = self._exhausted(chain, call.failures)
        self._end(call, None, final)
        raise final

    @staticmethod
    def _may_recover(route: Route, error: ProviderCallError, call: _Call) -> bool:
        """Will this provider be worth another attempt once its breaker lets calls through again?"""
        return (
            not route.breaker.closed
            and call.used.get(route.id, 0) < route.policy.max_attempts
            and route.policy.retryable(error)
        )

    @staticmethod
    async def _wait_for_breakers(routes: list[Route], timeout_s: float) -> bool:
        """Sleep until the first of ``routes`` admits a call (True), or False if none will within
        ``timeout_s``. Each breaker wakes its waiters itself (timer or trial's end): no polling."""
        if timeout_s <= 0:
            return False
        if len(routes) == 1:
            return await routes[0].breaker.wait_admittable(timeout_s)
        pending = {asyncio.ensure_future(r.breaker.wait_admittable(timeout_s)) for r in routes}
        try:
            while pending:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if any(task.result() for task in finished):
                    return True
            return False
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)

    def _exhausted(self, chain: list[Route], failures: list[tuple[str, ProviderCallError]]) -> ProviderCallError:
        if not failures:
            return ProviderCallError(
                f"no provider available: {', '.join(r.id for r in chain)} skipped (circuit open or request "
                "not portable)",
                kind="overloaded",
                provider=chain[0].id,
            )
        last_id, last = failures[-1]
        if len(failures) == 1:
            return last
        reasons = "; ".join(f"{pid}: {err}" for pid, err in failures)
        return ProviderCallError(
            f"every provider failed ({reasons})",
            kind=last.kind,
            provider=last_id,
            status=last.status,
            retry_after=last.retry_after,
            error_type=last.error_type,
        )

    async def _attempts(self, route: Route, wire: dict[str, Any], call: _Call, *, fallback: bool) -> dict[str, Any]:
        policy = route.policy
        context = call.context
        state = _Attempts()
        # Attempts are counted per call and provider across waits for its breaker: at most max_attempts.
        state.number = call.used.get(route.id, 0)

        def record(sent: _Sent, **outcome: Any) -> None:
            if outcome.get("batch") is None:  # a batch call's time is spent queued behind its batch: waiting
                call.sending_s += time.perf_counter() - sent.started
            self.ledger.attempt(
                call=call.id,
                provider=route.id,
                protocol=route.protocol,
                model=route.cfg.model,
                task_id=context.task_id,
                agent=context.agent,
                turn=context.turn,
                attempt=state.number,
                key=sent.key,
                started=sent.started_wall,
                latency_s=time.perf_counter() - sent.started,
                fallback=fallback,
                limiter_wait_s=sent.limiter_wait_s,
                **outcome,
            )

        async def attempt() -> dict[str, Any]:
            permit = route.breaker.admit()  # asked before every attempt: another task may have opened it
            if permit is None:
                raise _BreakerRefused(state.last_error)
            reported = False
            try:
                # The provider's rate limit, shared by every task: a 429's pause, in-flight slots, budgets.
                limit = await route.limiter.enter(
                    estimate_tokens(wire) if route.limiter.counts_tokens else 0, retry=state.number > 0
                )
                used_tokens: int | None = None
                try:
                    state.slot = None
                    slot = await route.pool.acquire()  # NoUsableKeyError: nothing sent, not retried, falls back
                    state.slot = slot
                    state.number += 1
                    call.used[route.id] = state.number
                    provider = route.providers[slot.label]
                    sent = _Sent(slot.label, time.time(), time.perf_counter(), limit.waited_s)
                    batch: dict[str, Any] | None = None
                    try:
                        raw = await provider.send(wire, context=context)
                        batch = raw.get(BATCH_KEY)  # answered through a batch: priced (and billed once) as one
                        checked, usage = _read_reply(provider, raw, policy.check_reply)
                    except ProviderCallError as error:
                        _failed(route, state, limit, slot, permit, error)
                        reported = True
                        paid = error.usage if isinstance(error, ProviderResponseError) else None  # billed all the same
                        used_tokens = paid.total_tokens if paid is not None else None
                        record(sent, error=error, usage=paid, batch=batch)
                        raise
                    route.breaker.record_success(permit)
                    limit.overloaded, reported = False, True  # an answer: the adaptive limit may grow
                    if usage is not None:
                        used_tokens = usage.input_tokens + usage.output_tokens
                    record(sent, usage=usage, batch=batch)
                    return raw if checked is None else CheckedReply(raw, checked)
                finally:
                    route.limiter.leave(limit, used_tokens)
            finally:
                if not reported:  # cancelled, no usable key, a bug: the trial (if this was it) is handed back
                    route.breaker.release(permit)

        return await policy.run(
            attempt,
            attempts=max(policy.max_attempts - state.number, 1),
            retry_if=_should_retry(route),
            wait=_retry_wait(policy),
            sleep=self.sleep,
        )

    # ----- ledger lines ----------------------------------------------------------------------------------
    def _skip(self, route: Route, call: _Call, reason: str) -> None:
        """One ledger line per call, provider and reason: a call that waits and is refused again writes none."""
        if (route.id, reason) in call.skipped:
            return
        call.skipped.add((route.id, reason))
        context = call.context
        self.ledger.write(
            LedgerLine(
                type="skip",
                call=call.id,
                provider=route.id,
                reason=reason,
                task_id=context.task_id,
                agent=context.agent,
                turn=context.turn,
            )
        )

    def _end(
        self,
        call: _Call,
        route: Route | None,
        error: ProviderCallError | None,
        *,
        fallback: bool = False,
    ) -> None:
        context = call.context
        self.ledger.write(
            LedgerLine(
                type="call",
                call=call.id,
                task_id=context.task_id,
                agent=context.agent,
                turn=context.turn,
                provider=route.id if route else None,
                model=route.cfg.model if route else None,
                outcome="ok" if error is None else error.kind,
                error=None if error is None else str(error)[:500],
                fallback=fallback,
                failed_providers=[pid for pid, _ in call.failures],
                attempts=sum(call.used.values()),
                breaker_wait_s=round(call.breaker_wait_s, 6),
                # Time of the call not spent in a request: rate limits, a resting key, retries' back-off, breakers.
                wait_s=round(max(0.0, time.perf_counter() - call.started - call.sending_s), 6),
            )
        )

    def summary(self) -> dict[str, Any]:
        """The ledger's summary plus the live state of breakers and keys (for ``summary.json``)."""
        out = self.ledger.summary()
        out["chains"] = {agent: [r.id for r in chain] for agent, chain in self.chains.items()}
        out["breakers"] = {rid: r.breaker.snapshot()["state"] for rid, r in self.routes.items()}
        out["keys"] = {rid: r.pool.stats() for rid, r in self.routes.items()}
        return out

    def __repr__(self) -> str:
        return f"ResilientProvider(chains={ {a: [r.id for r in c] for a, c in self.chains.items()} })"


def _failed(
    route: Route, state: _Attempts, limit: Slot, slot: KeySlot, permit: Permit, error: ProviderCallError
) -> None:
    """What one failed attempt tells the route: the breaker, the key pool, the adaptive limit, and (a 429) a
    pause for every task sending to this provider."""
    state.last_error, limit.overloaded = error, (True if error.kind in OVERLOAD_KINDS else None)
    if error.kind == "rate_limit":  # everyone waits it out, not only this task
        pause = error.retry_after if error.retry_after is not None else route.pool.cfg.cooldown_s
        route.limiter.back_off(min(pause, route.policy.max_retry_after_s))
    route.pool.report(slot, error)
    route.breaker.record_failure(error, permit)


def _read_reply(provider: BaseProvider, raw: dict[str, Any], check: bool) -> tuple[ModelResponse | None, Usage | None]:
    """The reply normalised once, and what it was billed. A reply that cannot be used raises (a retry asks
    again), with what it was billed on the error; under ``retry.check_reply=false`` it goes on unread (the turn's
    normalize node fails on it, not retried), its bill still counted."""
    try:
        checked = provider.normalize(raw)
    except ProviderResponseError as unusable:
        if check:
            raise
        return None, unusable.usage
    return checked, checked.usage


def breaker_listener(ledger: UsageLedger) -> Callable[[Transition], None]:
    def on_transition(transition: Transition) -> None:
        t = transition
        log.warning("provider '%s': circuit %s -> %s (%s)", t.provider, t.old, t.new, t.reason)
        ledger.write(LedgerLine.from_dict({"type": "breaker", **transition.to_dict(), "ts": transition.at}))

    return on_transition


def _should_retry(route: Route) -> Callable[[BaseException], bool]:
    """Whether a failed attempt on ``route`` is tried again on the same route (else the call falls back)."""

    def should_retry(error: BaseException) -> bool:
        if not isinstance(error, ProviderCallError) or isinstance(error, NoUsableKeyError):
            return False  # CancelledError and bugs included: they propagate as they are
        if not route.breaker.closed:
            return False  # this failure opened the breaker, or it was the half-open trial: fall back now
        if error.kind in RETIRE_KINDS:
            return bool(route.pool.live())  # the key was retired: another key may do
        return route.policy.retryable(error)

    return should_retry


def _retry_wait(policy: RetryPolicy) -> Callable[[RetryCallState], float]:
    """How long to wait before the next attempt: the policy's backoff, or none when the key pool waits."""

    def wait(retry_state: RetryCallState) -> float:
        error = retry_state.outcome.exception() if retry_state.outcome else None
        if isinstance(error, ProviderCallError) and (error.kind in RETIRE_KINDS or error.kind == "rate_limit"):
            # The key pool does this waiting: the next key is ready now, or acquire() waits for a
            # resting key's cooldown (its retry-after), within key_pool.max_wait_s.
            return 0.0
        return policy.wait_s(retry_state.attempt_number, error)

    return wait
