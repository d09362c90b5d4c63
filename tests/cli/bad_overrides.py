"""The table of bad overrides walked through the real command line (tests/cli/test_bad_overrides.py).

Each row: the overrides, and a fragment the one-line message must contain (it names the setting or the fix).
Most rows fail while Hydra composes (a second each); those checked by the app itself import the whole stack, so
the table keeps one or two of those per group.
"""

from __future__ import annotations

BAD_OVERRIDES: list[tuple[tuple[str, ...], str]] = [
    # provider
    (("provider=claud",), "did you mean claude"),
    (("provider=base_provider",), "not a choice"),
    (("provider.max_tokens=many",), "provider.max_tokens"),
    (("provider.emulator_script=/nonexistent/script.yaml",), "provider.emulator_script"),
    (("provider.fallbacks=[nobody]",), "nobody"),
    (("provider.emulator_faults={seed: 3}",), "set whole with ++provider.emulator_faults={...}"),
    # pipeline
    (("pipeline=agent_trun",), "did you mean agent_turn"),
    (("pipeline.nodes.call_model._target_=no.such.Node",), "no.such.Node"),
    # runner
    (("runner=legcy",), "did you mean legacy"),
    # repair
    (("repair=ful",), "did you mean full"),
    (("repair.stages=[nope]",), "nope"),
    # tools
    (("tools=defualt",), "did you mean default"),
    (("tools.servers.tool-math.command=''",), "tool-math"),
    (("tools.scope=forever",), "forever"),
    (("tools.servers.tool-math.comand=x",), "did you mean command"),
    # experiment
    (("+experiment=gaa",), "did you mean gaia"),
    (("experiment.attempts=0",), "experiment.attempts"),
    # subagents
    (("+subagents=nobody",), "subagents=nobody"),
    # agent
    (("agent.max_turn=3",), "did you mean max_turns"),
    (("+agent.max_turn=3",), "did you mean max_turns"),
    (("agent.max_turns=0",), "agent.max_turns"),
    (("~agent.nothing",), "agent.nothing"),
    # dataset
    (("dataset.path=/nonexistent/flowllm-data",), "/nonexistent/flowllm-data"),
    # recorder, memory, the root
    (("recorder.snapshot=some",), "expected one of [all, errors, none]"),
    (("replay.tools=sometimes",), "expected one of [saved, live]"),
    (("memory.enabled=perhaps",), "memory.enabled"),
    (("+foo=1",), "foo"),
    # the command line itself, and Hydra's groups
    (("agent.max_turns=[",), "cannot read an override"),
    (("provider=offline,claude",), "add -m"),
    (("hydra/launcher=joblb",), "did you mean joblib"),
]
