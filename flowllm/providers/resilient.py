"""The resilient provider: retries, key pools, fallback chains with circuit breakers, and the usage ledger,
behind the same ``Provider`` contract as a single SDK provider.

    send(request, context)
      chain = the agent's chain (provider.agent_models) or the main one: primary, then provider.fallbacks
      for each provider of the chain:
          its breaker open?            -> skip it (ledger: skip)
          attempts, driven by tenacity:
              key = key_pool.acquire()             (round robin; waits for a resting key, within limits)
              raw = sdk_provider.send(request)     (the request rebuilt for this provider if it is not the
                                                    primary: another protocol, model or max_tokens)
              reply checked with normalize         (an empty or unreadable reply is a failed attempt too)
              ledger: attempt line; key pool, breaker told of the outcome
          answered -> the raw reply, tagged with who answered (``flowllm_route``)
          failed   -> the next provider, unless the error is the request's fault (400, context length)

``normalize(raw)`` reads the tag and lets the provider that answered read its own reply.
``asyncio.CancelledError`` is never caught: it goes through retries, waits and fallbacks untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, stop_after_delay

from flowllm.config.schema import ProviderConfig
from flowllm.core.interfaces import CallContext, ToolProtocol, WireProtocol
from flowllm.core.types import Block, Message, ModelResponse, ToolSpec
from flowllm.providers.base import BaseProvider
from flowllm.providers.breaker import CircuitBreaker, Transition
from flowllm.providers.errors import ProviderCallError
from flowllm.providers.keys import RETIRE_KINDS, KeyPool, KeySlot, NoUsableKeyError
from flowllm.providers.ledger import UsageLedger
from flowllm.providers.registry import MAIN_AGENT, RoutePlan
from flowllm.providers.retry import RetryPolicy

log = logging.getLogger(__name__)

ROUTE_KEY = "flowllm_route"
# Errors that are the request's own fault: another provider would refuse it too, so no fallback.
NO_FALLBACK_KINDS = frozenset({"bad_request", "context_length"})


class WireRequest(dict[str, Any]):
    """A wire request that remembers the canonical prompt it was built from, so a fallback provider with
    another protocol can build its own. It is still a plain dict to everything else (orjson writes it as
    one); a request read back from disk has no canonical prompt and only falls back within its protocol."""

    canonical: tuple[list[Block], list[Message], list[ToolSpec]] | None = None


@dataclass
class Route:
    """One provider of a chain, open: an SDK provider per key, the key pool, the breaker, the policy."""

    id: str
    cfg: ProviderConfig
    providers: dict[str, BaseProvider]  # key label -> provider using that key
    pool: KeyPool
    breaker: CircuitBreaker
    policy: RetryPolicy

    @property
    def any_provider(self) -> BaseProvider:
        return next(iter(self.providers.values()))

    @property
    def protocol(self) -> str:
        return self.cfg.protocol


class _Attempts:
    """The state one provider's attempts share with tenacity's callbacks."""

    def __init__(self) -> None:
        self.number = 0
        self.slot: KeySlot | None = None


class ResilientProvider:
    """A ``Provider`` made of routes (see the module doc). Built by ``open_provider``."""

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
        head = self.primary.any_provider
        self.name: str = head.name
        self.protocol: WireProtocol = head.protocol
        self.model: str = head.model
        self.tool_protocol: ToolProtocol = head.tool_protocol
        self.supports_cache_control: bool = head.supports_cache_control

    # ----- the Provider contract -------------------------------------------------------------------------
    def build_request(self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        request = WireRequest(self.primary.any_provider.build_request(system=system, messages=messages, tools=tools))
        request.canonical = (system, messages, tools)
        return request

    def normalize(self, raw: dict[str, Any]) -> ModelResponse:
        route = self.routes.get(str((raw.get(ROUTE_KEY) or {}).get("provider", self.primary.id)), self.primary)
        return route.any_provider.normalize(raw)

    async def aclose(self) -> None:
        for route in self.routes.values():
            for provider in route.providers.values():
                await provider.aclose()

    def for_agent(self, agent: str) -> list[str]:
        """The provider ids that serve ``agent``, in order (for logs and the summary)."""
        return [r.id for r in self.chains.get(agent) or self.chains[MAIN_AGENT]]

    # ----- sending ---------------------------------------------------------------------------------------
    def _request_for(self, route: Route, request: dict[str, Any]) -> dict[str, Any] | None:
        """``request`` as ``route`` must receive it; None when it cannot be rebuilt for that route."""
        if route is self.primary:
            return request
        canonical = getattr(request, "canonical", None)
        if canonical is not None:
            system, messages, tools = canonical
            return route.any_provider.build_request(system=system, messages=messages, tools=tools)
        if route.protocol == self.primary.protocol:
            return {**request, "model": route.cfg.model}
        return None

    async def send(self, request: dict[str, Any], *, context: CallContext) -> dict[str, Any]:
        chain = self.chains.get(context.agent) or self.chains[MAIN_AGENT]
        call = self.ledger.next_call_id()
        failures: list[tuple[str, ProviderCallError]] = []
        deadline = self.clock() + self.primary.policy.max_total_s
        while True:
            waiting_on_breakers: list[float] = []
            for position, route in enumerate(chain):
                wire = self._request_for(route, request)
                if wire is None:
                    self._skip(route, call, context, "request_not_portable")
                    continue
                if not route.breaker.allow():
                    self._skip(route, call, context, "breaker_open")
                    waiting_on_breakers.append(route.breaker.retry_at())
                    continue
                try:
                    raw = await self._attempts(route, wire, context, call, fallback=position > 0)
                except ProviderCallError as error:
                    if isinstance(error, NoUsableKeyError):
                        self._skip(route, call, context, "no_usable_key")
                    failures.append((route.id, error))
                    if error.kind in NO_FALLBACK_KINDS:
                        self._end(call, context, None, failures, error)
                        raise
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
                self._end(call, context, route, failures, None, fallback=position > 0)
                return raw
            # Nobody answered. If some provider was only skipped for an open breaker that reopens soon
            # enough, wait for it rather than fail the task for a brief outage.
            now = self.clock()
            if waiting_on_breakers and min(waiting_on_breakers) <= deadline and not failures:
                await self.sleep(max(min(waiting_on_breakers) - now, 0.0))
                continue
            break
        final = self._exhausted(chain, failures)
        self._end(call, context, None, failures, final)
        raise final

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

    async def _attempts(
        self, route: Route, wire: dict[str, Any], context: CallContext, call: int, *, fallback: bool
    ) -> dict[str, Any]:
        policy = route.policy
        state = _Attempts()

        def record(key: str, started_wall: float, started: float, **outcome: Any) -> None:
            self.ledger.attempt(
                call=call,
                provider=route.id,
                protocol=route.protocol,
                model=route.cfg.model,
                task_id=context.task_id,
                agent=context.agent,
                turn=context.turn,
                attempt=state.number,
                key=key,
                started=started_wall,
                latency_s=time.perf_counter() - started,
                fallback=fallback,
                **outcome,
            )

        async def attempt() -> dict[str, Any]:
            state.number += 1
            state.slot = None
            slot = await route.pool.acquire()  # NoUsableKeyError: nothing sent, not retried, falls back
            state.slot = slot
            provider = route.providers[slot.label]
            started_wall = time.time()
            started = time.perf_counter()
            try:
                raw = await provider.send(wire, context=context)
                usage = provider.normalize(raw).usage if policy.check_reply else None
            except asyncio.CancelledError:
                route.breaker.abandon()
                raise
            except ProviderCallError as error:
                route.pool.report(slot, error)
                route.breaker.record_failure(error)
                record(slot.label, started_wall, started, error=error)
                raise
            route.breaker.record_success()
            record(slot.label, started_wall, started, usage=usage)
            return raw

        def should_retry(error: BaseException) -> bool:
            if not isinstance(error, ProviderCallError) or isinstance(error, NoUsableKeyError):
                return False  # CancelledError and bugs included: they propagate as they are
            if not route.breaker.closed:
                return False  # this failure opened the breaker, or it was the half-open trial: fall back now
            if error.kind in RETIRE_KINDS:
                return bool(route.pool.live())  # the key was retired: another key may do
            return policy.retryable(error)

        def wait(retry_state: RetryCallState) -> float:
            error = retry_state.outcome.exception() if retry_state.outcome else None
            if isinstance(error, ProviderCallError) and (error.kind in RETIRE_KINDS or error.kind == "rate_limit"):
                # The key pool does this waiting: the next key is ready now, or acquire() waits for a
                # resting key's cooldown (its retry-after), within key_pool.max_wait_s.
                return 0.0
            return policy.wait_s(retry_state.attempt_number, error)

        retrying = AsyncRetrying(
            stop=stop_after_attempt(policy.max_attempts) | stop_after_delay(policy.max_total_s),
            wait=wait,
            retry=retry_if_exception(should_retry),
            sleep=self.sleep,
            reraise=True,
        )
        result: dict[str, Any] = await retrying(attempt)
        return result

    # ----- ledger lines ----------------------------------------------------------------------------------
    def _skip(self, route: Route, call: int, context: CallContext, reason: str) -> None:
        self.ledger.write(
            {
                "type": "skip",
                "call": call,
                "provider": route.id,
                "reason": reason,
                "task_id": context.task_id,
                "agent": context.agent,
                "turn": context.turn,
            }
        )

    def _end(
        self,
        call: int,
        context: CallContext,
        route: Route | None,
        failures: list[tuple[str, ProviderCallError]],
        error: ProviderCallError | None,
        *,
        fallback: bool = False,
    ) -> None:
        self.ledger.write(
            {
                "type": "call",
                "call": call,
                "task_id": context.task_id,
                "agent": context.agent,
                "turn": context.turn,
                "provider": route.id if route else None,
                "model": route.cfg.model if route else None,
                "outcome": "ok" if error is None else error.kind,
                "error": None if error is None else str(error)[:500],
                "fallback": fallback,
                "failed_providers": [pid for pid, _ in failures],
            }
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


def breaker_listener(ledger: UsageLedger) -> Callable[[Transition], None]:
    def on_transition(transition: Transition) -> None:
        t = transition
        log.warning("provider '%s': circuit %s -> %s (%s)", t.provider, t.old, t.new, t.reason)
        ledger.write({"type": "breaker", **transition.to_dict(), "ts": transition.at})

    return on_transition
