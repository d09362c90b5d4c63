"""A fork exported: its live calls name the model the live provider was sent, its replayed calls claim no
billed usage, and its Inspect log is labelled with the live model and bills an exact replay 0, read back by
inspect_ai and by the OpenTelemetry SDK's in-memory exporter (the spans ``export --format otlp`` sends)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.export.runs import flowllm_export
from tests.replay.runs import CLEAN_TASK, LENIENT_TASK, ONLY_PYTHON_TOOL, PROJECT_ROOT, TASK_OVERRIDE, run_flowllm

inspect_log = pytest.importorskip(
    "inspect_ai.log", reason='inspect_ai is not installed (pip install "flowllm[inspect]")'
)
inspect_analysis = pytest.importorskip("inspect_ai.analysis")
pytest.importorskip(
    "opentelemetry.sdk", reason='the OpenTelemetry SDK is not installed (pip install "flowllm[telemetry]")'
)

from tests.export.test_telemetry_spans import after_the_fact  # noqa: E402 (needs the SDK)

LIVE_MODEL = "gpt-4o"


@dataclass(frozen=True)
class Fork:
    saved: Path
    fork: Path


@pytest.fixture(scope="module")
def fork(tmp_path_factory: pytest.TempPathFactory) -> Fork:
    base = tmp_path_factory.mktemp("fork-export")
    saved = run_flowllm(base / "saved", TASK_OVERRIDE, *ONLY_PYTHON_TOOL).check().run_dir
    # The live provider: the emulator over OpenAI Chat, asked for gpt-4o (the saved run asked flowllm-emulator).
    live = OmegaConf.load(PROJECT_ROOT / "flowllm" / "conf" / "provider" / "offline.yaml")
    live.pop("defaults", None)
    live.update(name="live4o", protocol="openai_chat", model=LIVE_MODEL)
    live.emulator_script = str(PROJECT_ROOT / "flowllm" / "data" / "sample" / "script.yaml")
    (base / "providers").mkdir()
    OmegaConf.save(live, base / "providers" / "live4o.yaml")
    forked = run_flowllm(
        base / "fork",
        "provider=replay",
        f"provider.run_dir={saved}",
        "provider.fork=live",
        "provider.live=live4o",
        f"provider.config_dir={base / 'providers'}",
        "repair=strict",  # the lenient task's second request differs: it goes live there; the clean one replays
    ).check()
    return Fork(saved, forked.run_dir)


def test_spans_name_the_live_model_and_claim_no_usage_for_replayed_calls(fork: Fork) -> None:
    chats = [s for s in after_the_fact(fork.fork) if (s.attributes or {}).get("gen_ai.operation.name") == "chat"]
    live = [s.attributes for s in chats if s.attributes and s.attributes.get("flowllm.forked")]
    replayed = [s.attributes for s in chats if s.attributes and s.attributes.get("flowllm.replayed")]
    assert len(live) == 1 and len(replayed) == len(chats) - 1 >= 2
    assert live[0]["gen_ai.request.model"] == live[0]["gen_ai.response.model"] == LIVE_MODEL
    assert live[0]["gen_ai.usage.input_tokens"] > 0 and live[0]["flowllm.task_id"] == LENIENT_TASK
    for attrs in replayed:
        assert not any(key.startswith("gen_ai.usage.") for key in attrs), attrs
        assert attrs["gen_ai.request.model"] == "flowllm-emulator"
    # A task's own span sums what its calls claim: nothing for the task that only replayed.
    agents = {
        s.attributes["flowllm.task_id"]: s.attributes
        for s in after_the_fact(fork.fork)
        if s.attributes and s.attributes.get("gen_ai.operation.name") == "invoke_agent" and s.parent is None
    }
    assert "gen_ai.usage.input_tokens" not in agents[CLEAN_TASK]
    assert agents[LENIENT_TASK]["gen_ai.usage.input_tokens"] == live[0]["gen_ai.usage.input_tokens"]


def test_the_inspect_log_is_labelled_with_the_live_model_and_bills_an_exact_replay_0(
    fork: Fork, tmp_path: Path
) -> None:
    target = tmp_path / "fork.eval"
    done = flowllm_export(fork.fork, "--format", "inspect", "-o", str(target))
    assert done.returncode == 0, done.stderr
    log = inspect_log.read_eval_log(str(target))
    assert log.eval.model == f"live4o/{LIVE_MODEL}"
    samples = {s.id: s for s in log.samples or []}
    events = [e for e in samples[LENIENT_TASK].events if e.event == "model"]
    assert [e.requested_model for e in events] == ["flowllm-emulator", LIVE_MODEL]
    assert events[0].output.usage is None and events[1].output.usage.input_tokens > 0
    assert samples[CLEAN_TASK].model_usage[log.eval.model].total_cost == 0
    assert samples[LENIENT_TASK].model_usage[log.eval.model].total_cost > 0
    frame = inspect_analysis.samples_df(str(target)).set_index("id")
    costs = {task: json.loads(frame.loc[task, "model_usage"])[log.eval.model]["total_cost"] for task in samples}
    assert costs[CLEAN_TASK] == 0 and costs[LENIENT_TASK] > 0


def test_the_inspect_logs_tokens_are_the_ones_billed_beside_their_cost(fork: Fork, tmp_path: Path) -> None:
    """A replayed reply processed no token: only the live calls' tokens stand beside the live calls' cost, in
    each sample and over the run (inspect's model usage pairs the two)."""
    target = tmp_path / "fork.eval"
    assert flowllm_export(fork.fork, "--format", "inspect", "-o", str(target)).returncode == 0
    log = inspect_log.read_eval_log(str(target))
    billed = [
        line
        for line in map(json.loads, (fork.fork / "usage.jsonl").read_text(encoding="utf-8").splitlines())
        if line["type"] == "attempt" and line["outcome"] == "ok"
    ]
    assert billed and {line["task_id"] for line in billed} == {LENIENT_TASK}

    def tokens(lines: list[dict[str, object]], kind: str) -> int:
        return sum(int(line["usage"][kind]) for line in lines)  # type: ignore[index]

    samples = {s.id: s for s in log.samples or []}
    clean = samples[CLEAN_TASK].model_usage[log.eval.model]
    assert (clean.input_tokens, clean.output_tokens, clean.total_cost) == (0, 0, 0)
    saved = json.loads((fork.fork / "tasks" / LENIENT_TASK / "result.json").read_text(encoding="utf-8"))
    live = samples[LENIENT_TASK].model_usage[log.eval.model]
    assert live.input_tokens == tokens(billed, "input_tokens") < saved["usage"]["input_tokens"]
    assert live.output_tokens == tokens(billed, "output_tokens")
    run = log.stats.model_usage
    assert set(run) == {log.eval.model}
    assert (run[log.eval.model].input_tokens, run[log.eval.model].output_tokens) == (
        tokens(billed, "input_tokens"),
        tokens(billed, "output_tokens"),
    )
    summary = json.loads((fork.fork / "summary.json").read_text(encoding="utf-8"))
    assert run[log.eval.model].total_cost == pytest.approx(summary["cost_usd"])


def test_the_dataframes_cost_a_replayed_task_0_so_a_forks_mean_cost_per_task_is_true(fork: Fork) -> None:
    pytest.importorskip("pandas")
    from flowllm import analysis

    tasks = analysis.load(fork.fork).tasks.set_index("task_id")
    assert tasks.loc[CLEAN_TASK, "cost_usd"] == 0  # served from the saved run: billed nothing (not NA)
    billed = sum(
        line["cost_usd"]
        for line in map(json.loads, (fork.fork / "usage.jsonl").read_text(encoding="utf-8").splitlines())
        if line["type"] == "attempt"
    )
    assert tasks.loc[LENIENT_TASK, "cost_usd"] == pytest.approx(billed) and billed > 0
    assert tasks["cost_usd"].mean() == pytest.approx(billed / len(tasks))
