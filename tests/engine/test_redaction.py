"""The redactor masks every secret the process holds, configured or not, in files and in shown text."""

from __future__ import annotations

import orjson

from flowllm.engine.recorder import REDACTED, Redactor, environment_secrets

ENV = {
    "OPENAI_API_KEY": "sk-unconfigured-1234567890abcdef",
    "HF_TOKEN": "hf_abcdefghijklmnopqrstuv",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY",
    "DB_PASSWORD": "correct-horse-battery",
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "SHORT_TOKEN": "abc",  # too short to mask without hitting innocent text
}


def test_secret_named_environment_values_are_found() -> None:
    found = set(environment_secrets(ENV))
    assert found == {ENV[k] for k in ("OPENAI_API_KEY", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD")} | {"abc"}
    assert "/usr/local/bin:/usr/bin:/bin" not in found


def test_a_tool_result_holding_an_unconfigured_key_is_masked_on_disk() -> None:
    redactor = Redactor(["configured-key-000000"], environ=ENV)
    record = {"result": f"env: OPENAI_API_KEY={ENV['OPENAI_API_KEY']} HF={ENV['HF_TOKEN']} abc"}
    data = redactor.dumps(record)
    for name in ("OPENAI_API_KEY", "HF_TOKEN"):
        assert ENV[name].encode() not in data
    assert orjson.loads(data)["result"] == f"env: OPENAI_API_KEY={REDACTED} HF={REDACTED} abc"
    assert redactor.mask(f"answer {ENV['DB_PASSWORD']}") == f"answer {REDACTED}"


def test_an_empty_environment_masks_only_the_configured_keys() -> None:
    redactor = Redactor(["configured-key-000000"], environ={})
    assert redactor.secrets == ["configured-key-000000"]
