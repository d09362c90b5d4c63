"""The small decisions, one by one: retry policy, breaker states, key pool, route planning, fault draws."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from flowllm.config.provider_schema import BreakerConfig, KeyPoolConfig, ProviderConfig, RetryConfig
from flowllm.config.providers import FileResolver
from flowllm.emulator.faults import Draw, FaultConfigError, FaultPlan
from flowllm.errors import ConfigError
from flowllm.providers import ProviderCallError, ProviderConfigError, check_provider_config
from flowllm.providers.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from flowllm.providers.keys import KeyPool, NoUsableKeyError, load_keys, secret_values
from flowllm.providers.registry import plan_routes
from flowllm.providers.retry import RetryPolicy

from .conftest import FakeTime, provider_cfg


def err(kind: str, **kw: object) -> ProviderCallError:
    return ProviderCallError("x", kind=kind, **kw)  # type: ignore[arg-type]


# ----- retry policy ------------------------------------------------------------------------------------------
def test_transient_kinds_are_retried_and_request_faults_never() -> None:
    policy = RetryPolicy.from_config(RetryConfig())
    for kind in ("connection", "timeout", "rate_limit", "overloaded", "server", "conflict", "truncated"):
        assert policy.retryable(err(kind)), kind
    for kind in ("bad_request", "context_length", "auth", "permission", "not_found", "quota"):
        assert not policy.retryable(err(kind)), kind


def test_retry_after_is_honoured_up_to_the_cap_and_backoff_grows() -> None:
    policy = RetryPolicy.from_config(RetryConfig(base_delay_s=1.0, max_delay_s=8.0, max_retry_after_s=5.0))
    assert policy.wait_s(1, err("rate_limit", retry_after=2.5)) == 2.5
    assert policy.wait_s(1, err("rate_limit", retry_after=120.0)) == 5.0
    waits = [policy.wait_s(n, err("server")) for n in (1, 2, 3, 4, 5)]
    assert 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0 and 2.0 <= waits[2] <= 4.0
    assert all(4.0 <= w <= 8.0 for w in waits[3:])  # capped by max_delay_s


@pytest.mark.parametrize(
    ("retry", "fragment"),
    [
        (RetryConfig(max_attempts=0), "max_attempts"),
        (RetryConfig(base_delay_s=-1), "base_delay_s"),
        (RetryConfig(retry_on=["timeout", "auth"]), "auth can never be retried"),
        (RetryConfig(retry_on=["gremlins"]), "unknown error kind"),
    ],
)
def test_invalid_retry_settings_are_refused_at_start_up(retry: RetryConfig, fragment: str) -> None:
    with pytest.raises(ProviderConfigError, match=fragment):
        check_provider_config(provider_cfg(retry=retry, emulator_script=None, name="local", base_url="http://x"))


# ----- circuit breaker ---------------------------------------------------------------------------------------
def test_breaker_opens_after_consecutive_failures_and_recovers_through_one_trial() -> None:
    t = FakeTime()
    breaker = CircuitBreaker("p", BreakerConfig(failure_threshold=3, recovery_timeout_s=30), clock=t.clock)
    breaker.record_failure(err("server"))
    breaker.record_failure(err("timeout"))
    breaker.record_success()  # the count is of consecutive failures
    for _ in range(3):
        assert breaker.allow()
        breaker.record_failure(err("overloaded"))
    assert breaker.state == OPEN and not breaker.allow()
    t.now += 29.9
    assert not breaker.allow()
    t.now += 0.2
    assert breaker.allow() and breaker.state == HALF_OPEN
    assert not breaker.allow()  # one trial at a time
    breaker.record_failure(err("server"))  # trial failed: open again, timeout restarts
    assert breaker.state == OPEN and not breaker.allow()
    t.now += 30
    assert breaker.allow()
    breaker.record_success()
    assert breaker.state == CLOSED
    assert [(x.old, x.new) for x in breaker.transitions] == [
        (CLOSED, OPEN),
        (OPEN, HALF_OPEN),
        (HALF_OPEN, OPEN),
        (OPEN, HALF_OPEN),
        (HALF_OPEN, CLOSED),
    ]


def test_a_refused_request_does_not_count_against_the_provider() -> None:
    breaker = CircuitBreaker("p", BreakerConfig(failure_threshold=2), clock=FakeTime().clock)
    for _ in range(5):
        breaker.record_failure(err("bad_request"))
        breaker.record_failure(err("auth"))
    assert breaker.state == CLOSED


@pytest.mark.parametrize(
    ("breaker", "fragment"),
    [(BreakerConfig(failure_threshold=0), "failure_threshold"), (BreakerConfig(recovery_timeout_s=-1), "recovery")],
)
def test_invalid_breaker_settings_are_refused(breaker: BreakerConfig, fragment: str) -> None:
    with pytest.raises(ProviderConfigError, match=fragment):
        check_provider_config(provider_cfg(breaker=breaker, name="local", base_url="http://x"))


# ----- key pool ----------------------------------------------------------------------------------------------
def test_keys_come_from_several_variables_and_comma_lists() -> None:
    env = {"KA": "a1", "KB": " b1 , b2 ", "KC": ""}
    slots, missing = load_keys("KA, KB,KC", env)
    assert [s.label for s in slots] == ["KA", "KB[1]", "KB[2]"]
    assert [s.value for s in slots] == ["a1", "b1", "b2"] and missing == ["KC"]
    assert secret_values("KA,KB", env) == ["a1", "b1", "b2"]
    assert "b1" not in repr(slots)


async def test_round_robin_skips_a_rate_limited_key_until_its_cooldown_ends() -> None:
    t = FakeTime()
    slots, _ = load_keys("KA,KB,KC", {"KA": "a", "KB": "b", "KC": "c"})
    pool = KeyPool(slots, KeyPoolConfig(cooldown_s=5.0), clock=t.clock, sleep=t.sleep)
    assert [(await pool.acquire()).label for _ in range(3)] == ["KA", "KB", "KC"]
    pool.report(slots[1], err("rate_limit", retry_after=2.0))
    assert [(await pool.acquire()).label for _ in range(4)] == ["KA", "KC", "KA", "KC"]
    t.now += 2.0
    assert [(await pool.acquire()).label for _ in range(3)] == ["KA", "KB", "KC"]
    pool.report(slots[0], err("rate_limit"))  # no retry-after: the configured cooldown
    assert slots[0].ready_at == t.now + 5.0
    assert t.sleeps == []  # another key was always ready: nobody waited


async def test_when_every_key_rests_acquire_waits_for_the_first_or_gives_up() -> None:
    t = FakeTime()
    slots, _ = load_keys("KA,KB", {"KA": "a", "KB": "b"})
    pool = KeyPool(slots, KeyPoolConfig(max_wait_s=10.0), clock=t.clock, sleep=t.sleep)
    pool.report(slots[0], err("rate_limit", retry_after=3.0))
    pool.report(slots[1], err("rate_limit", retry_after=1.5))
    assert (await pool.acquire()).label == "KB" and t.sleeps == [1.5]
    pool.report(slots[1], err("rate_limit", retry_after=50.0))
    pool.report(slots[0], err("rate_limit", retry_after=50.0))
    with pytest.raises(NoUsableKeyError) as info:
        await pool.acquire()
    assert info.value.kind == "rate_limit" and "max_wait_s" in str(info.value)


async def test_a_refused_key_is_retired_with_a_warning_naming_the_variable_not_the_key(
    caplog: pytest.LogCaptureFixture,
) -> None:
    slots, _ = load_keys("KA,KB", {"KA": "sk-secret-a", "KB": "sk-secret-b"})
    pool = KeyPool(slots, KeyPoolConfig(), provider="claude")
    with caplog.at_level(logging.WARNING):
        pool.report(slots[0], err("auth", status=401))
    assert "KA" in caplog.text and "sk-secret" not in caplog.text
    assert [(await pool.acquire()).label for _ in range(2)] == ["KB", "KB"]
    pool.report(slots[1], err("auth", status=401))
    with pytest.raises(NoUsableKeyError, match="retired"):
        await pool.acquire()


def test_a_pool_with_no_usable_key_is_refused_at_start_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLOWLLM_T_A", raising=False)
    monkeypatch.setenv("FLOWLLM_T_B", " , ")
    cfg = ProviderConfig(name="claude", protocol="anthropic", model="m", api_key_env="FLOWLLM_T_A,FLOWLLM_T_B")
    with pytest.raises(ProviderConfigError, match="FLOWLLM_T_A, FLOWLLM_T_B are not set"):
        check_provider_config(cfg)
    monkeypatch.setenv("FLOWLLM_T_B", "k")
    check_provider_config(cfg)


# ----- route planning ----------------------------------------------------------------------------------------
def write_provider(folder: Path, name: str, body: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(f"defaults:\n  - base_provider\n  - _self_\n\nname: {name}\n{body}")


@pytest.fixture
def provider_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "provider"
    write_provider(folder, "a", "protocol: anthropic\nmodel: ma\nbase_url: http://127.0.0.1:1\nfallbacks: [b]\n")
    write_provider(folder, "b", "protocol: openai_chat\nmodel: mb\nbase_url: http://127.0.0.1:1\nfallbacks: [c]\n")
    write_provider(folder, "c", "protocol: openai_responses\nmodel: mc\nbase_url: http://127.0.0.1:1\n")
    write_provider(folder, "loop", "protocol: openai_chat\nmodel: ml\nbase_url: http://127.0.0.1:1\nfallbacks: [a]\n")
    (folder / "c_big.yaml").write_text("defaults:\n  - c\n  - _self_\n\nmodel: mc-big\n")
    return folder


def test_fallbacks_chain_depth_first_and_files_compose_like_hydra(provider_dir: Path) -> None:
    resolve = FileResolver(provider_dir)
    plan = plan_routes(resolve("a"), resolve)
    assert plan.chains["main"] == ["a", "b", "c"]
    assert [m.cfg.protocol for m in plan.chain("main")] == ["anthropic", "openai_chat", "openai_responses"]
    big = resolve("c_big")  # `defaults: [c]` inherited, then overridden
    assert (big.name, big.protocol, big.model) == ("c", "openai_responses", "mc-big")


def test_aliases_and_agent_models_pick_provider_and_model(provider_dir: Path) -> None:
    resolve = FileResolver(provider_dir)
    primary = resolve("c")
    primary.aliases = {"fast": "b", "smart": "a:ma-large", "cheap": ":mc-mini"}
    primary.agent_models = {"browser": "fast", "coder": "cheap"}
    primary.model = "smart"
    plan = plan_routes(primary, resolve)
    assert plan.chains["main"] == ["a:ma-large", "b", "c"]
    assert plan.members["a:ma-large"].cfg.model == "ma-large"
    assert plan.chains["browser"] == ["b", "c"]
    assert plan.chains["coder"] == ["c:mc-mini"]  # a model of the same provider, without its fallbacks
    assert [m.id for m in plan.chain("someone-else")] == plan.chains["main"]


@pytest.mark.parametrize(
    ("start", "fallbacks", "fragment"),
    [
        ("loop", None, "cycle: loop -> a -> b -> c"),
        ("a", ["nowhere"], "unknown provider 'nowhere'"),
        ("a", ["a"], "cycle: a -> a"),
    ],
)
def test_bad_chains_are_refused_with_the_chain_spelled_out(
    provider_dir: Path, start: str, fallbacks: list[str] | None, fragment: str
) -> None:
    resolve = FileResolver(provider_dir)
    cfg = resolve(start)
    if start == "loop":
        write_provider(provider_dir, "c", "protocol: openai_responses\nmodel: mc\nbase_url: x\nfallbacks: [loop]\n")
    if fallbacks is not None:
        cfg.fallbacks = fallbacks
    with pytest.raises(ProviderConfigError, match=fragment.replace("->", "->")):
        check_provider_config(cfg, resolve=resolve)


# ----- fault plans -------------------------------------------------------------------------------------------
def test_fault_draws_are_deterministic_and_close_to_their_rates() -> None:
    plan = FaultPlan.parse(
        {"seed": 3, "rules": [{"fault": "status", "status": 529, "rate": 0.1}, {"fault": "reset", "rate": 0.1}]}
    )
    draws = [Draw(f"t{i}", "main", 1, 1, "anthropic", False) for i in range(2000)]
    picked = [plan.pick(d) for d in draws]
    assert picked == [plan.pick(d) for d in draws]
    by_kind = {k: sum(1 for r in picked if r is not None and r.fault == k) for k in ("status", "reset")}
    assert 150 <= by_kind["status"] <= 250 and 150 <= by_kind["reset"] <= 250


def test_schedules_and_stream_only_faults() -> None:
    plan = FaultPlan.parse(
        {"rules": [{"fault": "truncate"}, {"fault": "status", "status": 503, "tasks": ["x"], "attempts": [1, 2]}]}
    )
    assert plan.pick(Draw("y", "main", 1, 1, "anthropic", True)).fault == "truncate"  # type: ignore[union-attr]
    assert plan.pick(Draw("y", "main", 1, 1, "anthropic", False)) is None  # nothing to truncate
    assert plan.pick(Draw("x", "main", 1, 2, "openai_chat", False)).status == 503  # type: ignore[union-attr]
    assert plan.pick(Draw("x", "main", 1, 3, "openai_chat", False)) is None


@pytest.mark.parametrize(
    ("faults", "fragment"),
    [
        ({"rules": [{"fault": "gremlin"}]}, "fault must be one of"),
        ({"rules": [{"fault": "status", "status": 200}]}, "HTTP error status"),
        ({"rules": [{"fault": "reset", "rate": 0.7}, {"fault": "empty", "rate": 0.6}]}, "add up to 1.3"),
        ({"rules": [{"fault": "delay"}]}, "delay_s"),
        ({"rulez": []}, "unknown keys"),
    ],
)
def test_bad_fault_sections_are_refused(faults: dict[str, object], fragment: str) -> None:
    with pytest.raises(FaultConfigError, match=fragment):
        FaultPlan.parse(faults)


# ----- ledger, secrets, Hydra resolution ---------------------------------------------------------------------
def test_ledger_prices_marks_estimates_and_buckets_by_hour(tmp_path: Path) -> None:
    from flowllm.core.types import Usage
    from flowllm.providers.ledger import UsageLedger
    from flowllm.spend.pricing import PriceTable

    prices = PriceTable.from_mapping({"models": {"m": {"input": 1.0, "output": 2.0, "cache_read": 0.1}}})
    common = {"protocol": "anthropic", "task_id": "t", "agent": "main", "turn": 1, "key": "K"}
    with UsageLedger(tmp_path / "usage.jsonl", prices=prices, user="ann") as ledger:
        ledger.attempt(
            call=1,
            provider="p",
            model="m",
            attempt=1,
            started=0.0,
            latency_s=0.5,
            error=err("server", status=500),
            **common,
        )  # type: ignore[arg-type]
        ledger.attempt(
            call=1,
            provider="p",
            model="m",
            attempt=2,
            started=10.0,
            latency_s=0.25,
            usage=Usage(input_tokens=1_000_000, output_tokens=500_000, cache_read_tokens=0),
            **common,
        )  # type: ignore[arg-type]
        ledger.attempt(
            call=2,
            provider="p",
            model="unpriced",
            attempt=1,
            started=3600.0,
            latency_s=1.0,
            usage=Usage(input_tokens=10, output_tokens=5, estimated=True),
            **common,
        )  # type: ignore[arg-type]
    summary = UsageLedger.read(tmp_path / "usage.jsonl").summary()
    assert summary["cost_usd"] == pytest.approx(2.0)  # 1M input x $1 + 0.5M output x $2
    assert summary["unpriced_calls"] == 1 and summary["estimated_calls"] == 1
    assert summary["latency_s_max"] == 1.0 and summary["latency_s_total"] == pytest.approx(1.75)
    hours = [(b["hour"], b["model"], b["user"], b["attempts"], b["failures"]) for b in summary["hourly"]]
    assert hours == [("1970-01-01T00:00Z", "m", "ann", 2, 1), ("1970-01-01T01:00Z", "unpriced", "ann", 1, 0)]
    assert summary["usage"]["input_tokens"] == 1_000_010 and summary["usage"]["estimated"] is True


def test_provider_secrets_cover_every_key_of_every_provider(
    provider_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flowllm.providers import provider_secrets

    monkeypatch.setenv("FLOWLLM_T_A", "ka1,ka2")
    monkeypatch.setenv("FLOWLLM_T_B", "kb")
    resolve = FileResolver(provider_dir)
    cfg = resolve("a")
    cfg.name, cfg.api_key_env = "claude", "FLOWLLM_T_A"
    backup = resolve("b")
    backup.name, backup.api_key_env = "deepseek", "FLOWLLM_T_B"
    lookup = {"b": backup, "c": resolve("c")}
    assert provider_secrets(cfg, resolve=lookup.__getitem__) == ["ka1", "ka2", "kb"]


def test_under_hydra_provider_names_resolve_through_compose() -> None:
    from hydra import initialize_config_dir

    from flowllm.config.providers import HydraResolver, default_resolver
    from flowllm.config.schema import register_configs
    from flowllm.resources import CONFIG_DIR

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        resolve = default_resolver(ProviderConfig(name="offline", model="m"))
        assert isinstance(resolve, HydraResolver)
        chat = resolve("offline_chat")
        assert (chat.name, chat.protocol, chat.model) == ("offline", "openai_chat", "flowllm-emulator")
        with pytest.raises(ConfigError, match="unknown provider 'nope'"):
            resolve("nope")


def test_providers_resolve_names_only_from_the_table_they_are_given(provider_dir: Path) -> None:
    """Under a running Hydra app too: a name the run's set-up did not resolve is refused, never composed."""
    from hydra import initialize_config_dir

    from flowllm.config.schema import register_configs
    from flowllm.providers.registry import ProviderTable
    from flowllm.resources import CONFIG_DIR

    resolve = FileResolver(provider_dir)
    primary = resolve("a")
    table = ProviderTable({"b": resolve("b"), "c": resolve("c")})
    assert plan_routes(primary, table).chains["main"] == ["a", "b", "c"]
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        primary.fallbacks = ["offline_chat"]
        with pytest.raises(ProviderConfigError, match="provider 'offline_chat' was not resolved before the run"):
            check_provider_config(primary)
    table("b").model = "changed"  # each lookup is a copy: the planner adjusts what it is given
    assert table("b").model == "mb"
