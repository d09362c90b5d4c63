"""Preflight: what the run needs, checked before the first task, every problem listed at once.

Without it a provider with nothing listening costs minutes of retries and breaker cycles before every task
fails, and a missing dataset shows up only after the missing key is fixed. Checked here, concurrently:

* every provider of the run (the main one, its fallbacks, aliases and agent models) answers a models listing
  (``GET <base_url>/models`` through its own SDK, no retries, nothing billed); emulated and replayed
  providers are skipped: they start with the run and cannot be unreachable;
* every configured tool server starts and lists its tools (``flowllm.tools.open_tool_catalog``). Given the
  run's exit stack, the check runs in the run's own event loop and its catalog is the run's: the run-scoped
  servers it started stay connected and serve the tasks, so no server is started twice.

Configuration problems (settings, keys, dataset, prices) are collected by ``flowllm.setup.build.prepare`` the
same way. All of them end as one ``PreflightError``: one line per problem, exit 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flowllm.config.provider_schema import ProviderConfig
from flowllm.core.scratch import scratch as scratch_folder
from flowllm.errors import BuildError

if TYPE_CHECKING:
    from flowllm.tools.client.settings import PoolSettings

DISABLED_MARK = "is disabled"  # the tool pool's reason for a server left out for a missing optional key


class PreflightError(BuildError):
    """One or more problems found before the first task; ``str()`` is one line per problem."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class ProviderTarget:
    id: str  # how the config names it (the ledger's provider id)
    cfg: ProviderConfig


def live_providers(targets: Sequence[ProviderTarget]) -> list[ProviderTarget]:
    """The providers preflight must reach: not emulated, not replayed, with an endpoint."""
    return [t for t in targets if not t.cfg.emulator_script and t.cfg.protocol != "replay"]


def _api_key(cfg: ProviderConfig) -> str:
    from flowllm.providers.keys import secret_values

    keys = secret_values(cfg.api_key_env)
    return keys[0] if keys else "flowllm-no-key"


async def list_models(cfg: ProviderConfig, timeout_s: float) -> None:
    """A models listing through the provider's own SDK; raises what the SDK raises."""
    key = _api_key(cfg)
    if cfg.protocol == "anthropic":
        import anthropic

        kwargs: dict[str, Any] = {"api_key": key, "base_url": cfg.base_url, "max_retries": 0, "timeout": timeout_s}
        if cfg.auth == "x-api-key":  # as flowllm.providers.factory sends it: the header, never both
            kwargs["default_headers"] = {"x-api-key": key, "Authorization": anthropic.Omit()}
        client: Any = anthropic.AsyncAnthropic(**kwargs)
    else:
        import openai

        client = openai.AsyncOpenAI(api_key=key, base_url=cfg.base_url, max_retries=0, timeout=timeout_s)
    try:
        await client.models.list()
        if cfg.batch.enabled:
            try:  # batch mode: the endpoint must have the batch API (a compatible server has none)
                if cfg.protocol == "anthropic":
                    await client.messages.batches.list(limit=1)
                else:
                    await client.batches.list(limit=1)
            except Exception as exc:
                raise NoBatchApiError(
                    exc, "/v1/messages/batches" if cfg.protocol == "anthropic" else "batches"
                ) from exc
    finally:
        await client.close()


class NoBatchApiError(Exception):
    """provider.batch is on and the endpoint's Message Batches API did not answer."""

    def __init__(self, cause: BaseException, path: str) -> None:
        super().__init__(str(cause))
        self.status_code = getattr(cause, "status_code", None)
        self.path = path


def describe_reach_failure(target: ProviderTarget, exc: BaseException) -> str:
    """One line: which provider, which URL, what went wrong, what to change."""
    url = target.cfg.base_url or "(the SDK's default URL)"
    where = f"provider '{target.id}' at {url}"
    if isinstance(exc, NoBatchApiError):
        said = f"HTTP {exc.status_code}" if exc.status_code is not None else (str(exc).splitlines() or ["no answer"])[0]
        return (
            f"{where}: provider.batch is on but it has no batch API ({said} to a listing of {exc.path}); "
            "drop provider.batch.enabled"
        )
    status = getattr(exc, "status_code", None)
    name = type(exc).__name__
    if status in (401, 403):
        return f"{where}: the key was refused (HTTP {status}); check {target.cfg.api_key_env or 'provider.api_key_env'}"
    if status == 404:
        hint = " (is /v1 missing from provider.base_url?)" if "/v1" not in url else ""
        return f"{where}: no models listing (HTTP 404){hint}; preflight.providers=false skips this check"
    if status is not None:
        return f"{where}: HTTP {status} to a models listing; preflight.providers=false skips this check"
    if "Timeout" in name:
        return f"{where}: no answer within the preflight timeout (preflight.timeout_s); is the server up?"
    if "Connection" in name:
        return f"{where}: cannot connect (is the server running? check provider.base_url)"
    return f"{where}: {name}: {str(exc).strip().splitlines()[0] if str(exc).strip() else name}"


async def check_providers(
    targets: Sequence[ProviderTarget],
    timeout_s: float,
    probe: Callable[[ProviderConfig, float], Awaitable[None]] = list_models,
) -> list[str]:
    async def one(target: ProviderTarget) -> str | None:
        try:
            await asyncio.wait_for(probe(target.cfg, timeout_s), timeout_s + 5)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            return describe_reach_failure(target, exc)
        return None

    found = await asyncio.gather(*(one(t) for t in live_providers(targets)))
    return [p for p in found if p]


def tool_start_timeout(timeout_s: float) -> float:
    """How long a tool server may take to start under ``preflight.timeout_s`` (a server's start-up, an
    interpreter and its imports, takes longer than a models listing)."""
    return max(timeout_s, 30.0)


async def check_tools(
    tools_cfg: PoolSettings | Mapping[str, Any],
    start_timeout_s: float,
    stack: contextlib.AsyncExitStack | None = None,
    *,
    warn: bool = True,
) -> tuple[list[str], Any]:
    """Start every configured server once; returns the problems and the catalog (None if none could be made).

    ``stack``: keep the run-scoped servers connected until it closes (the run's own catalog); without one they
    are stopped once checked. ``warn``: say which servers the run goes on without (false: the caller is a check
    made before the runs, whose own preflight says it)."""
    from flowllm.tools import discover_tools, load_settings, open_tool_catalog

    try:
        settings = load_settings(tools_cfg)
    except (ValueError, TypeError) as exc:
        return [str(exc)], None
    if not settings.servers:
        return [], None
    pool_log = logging.getLogger("flowllm.tools")
    level = pool_log.level
    pool_log.setLevel(logging.ERROR)  # a server that fails to start is reported below, once, as a problem
    with scratch_folder("flowllm-preflight-") as scratch:
        try:
            if stack is not None:
                catalog = await stack.enter_async_context(open_tool_catalog(tools_cfg, start_timeout_s=start_timeout_s))
            else:
                catalog = await discover_tools(tools_cfg, Path(scratch), start_timeout_s=start_timeout_s)
        except Exception as exc:
            return [f"tool servers: {type(exc).__name__}: {exc}"], None
        finally:
            pool_log.setLevel(level)
    problems = [
        f"tools.servers.{name}: did not start: {reason}"
        for name, reason in catalog.unavailable.items()
        if DISABLED_MARK not in reason and name not in catalog.withdrawn
    ]
    if warn and not problems:  # the run goes on without them: said once, before the first task (console and app.log)
        for name, reason in catalog.unavailable.items():
            logging.getLogger("flowllm").warning("flowllm: tool %s is unavailable: %s", name, reason)
    return problems, catalog


async def preflight(
    targets: Sequence[ProviderTarget],
    tools_cfg: PoolSettings | Mapping[str, Any],
    *,
    providers: bool = True,
    tools: bool = True,
    timeout_s: float = 15.0,
    stack: contextlib.AsyncExitStack | None = None,
) -> Any:
    """Run the live checks together; raise PreflightError with every problem, else return the tool catalog.

    ``stack``: the run's exit stack; the catalog's run-scoped servers then stay up for the run (``check_tools``)."""
    reach = check_providers(targets, timeout_s) if providers else _nothing()
    start = check_tools(tools_cfg, tool_start_timeout(timeout_s), stack) if tools else _no_tools()
    provider_problems, (tool_problems, catalog) = await asyncio.gather(reach, start)
    problems = [*provider_problems, *tool_problems]
    if problems:
        raise PreflightError(problems)
    return catalog


async def _nothing() -> list[str]:
    return []


async def _no_tools() -> tuple[list[str], Any]:
    return [], None
