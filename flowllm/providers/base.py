"""What the three wire protocols share: the call skeleton, tool naming, token estimates.

A provider has three halves: ``build_request`` (pure), ``send`` (the only I/O: the
official SDK, streamed or not) and ``normalize`` (pure). ``BaseProvider`` implements ``send`` and
``normalize`` once:

* ``send`` splits the wire dict into the SDK method's named parameters and ``extra_body`` (so vendor keys from
  ``provider.extra_body`` reach the server untouched), adds the task headers, and returns either the response
  body or ``{"stream": True, "events": [...]}``. A plain call goes through the SDK's ``with_raw_response``: the
  SDK still builds and sends the request and raises its typed errors on a failed status, but the body kept is
  the server's own JSON, decoded once, instead of the SDK's pydantic model of it dumped back to a dict (the same
  keys and values, in the server's order, for about 0.2 ms of CPU less per call).
* ``normalize`` folds saved stream events back into the non-streamed body shape first (``streaming.py``), then
  reads that body. One reader for both paths is what makes streamed and plain calls of the same reply equal.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import zlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from flowllm.config.provider_schema import ContentFormat, ProviderConfig
from flowllm.core.interfaces import CallContext, ToolProtocol, WireProtocol
from flowllm.core.media import MEDIA_TYPES, degrade_messages
from flowllm.core.types import Block, Message, ModelResponse, ToolSpec, Usage
from flowllm.errors import ErrorKind
from flowllm.providers.clients import ClientShards
from flowllm.providers.errors import (
    ProviderCallError,
    ProviderResponseError,
    classify_exception,
)
from flowllm.providers.wire.models import Adjustment, shape_request
from flowllm.rundir.epochs import current_epoch

if TYPE_CHECKING:
    from flowllm.providers.batch import Batcher
TASK_HEADER = "X-Flowllm-Task"
AGENT_HEADER = "X-Flowllm-Agent"
TURN_HEADER = "X-Flowllm-Turn"
EPOCH_HEADER = "X-Flowllm-Epoch"  # sent in an ``experiment.epochs`` run: the emulator's script may vary by epoch
# Keys a cache breakpoint may carry on a canonical block; only the Anthropic protocol sends them.
CACHE_KEY = "cache_control"
# Added to a raw reply only when the server sent no usage (or a prompt count of zero, which cannot be true),
# so the estimate can count the prompt too: the characters of the text the request carried.
PROMPT_CHARS_KEY = "flowllm_prompt_chars"
# Request keys whose string values a model reads (message text, call arguments, tool results, tool schemas);
# everything else (the JSON syntax, the model name, flags) is not prompt and not counted in an estimate.
_PROMPT_KEYS = frozenset(
    {"content", "text", "arguments", "output", "instructions", "system", "name", "description", "input"}
)


def estimate_tokens(text: str) -> int:
    """A deterministic stand-in for a tokenizer: about four characters per token."""
    return math.ceil(len(text) / 4) if text else 0


def wire_tool_name(spec: ToolSpec) -> str:
    """The name a tool is offered under natively: ``server-name`` (the parser splits it after the server)."""
    return f"{spec['server']}-{spec['name']}" if spec.get("server") else spec["name"]


def dump_arguments(arguments: Any) -> str:
    """Tool-call arguments as JSON text (Anthropic gives a dict; the contract wants the text)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False)


def parse_arguments(text: str) -> tuple[dict[str, Any], bool]:
    """(the arguments as a dict, whether ``text`` was a clean JSON object).

    Canonical ``tool_use`` blocks hold a dict; when a server sends arguments that do not parse, the block
    keeps ``{}`` and the raw text under ``arguments_text`` so the exact text can be sent back and repaired
    later.
    """
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}, False
    return (value, True) if isinstance(value, dict) else ({}, False)


def strip_cache_control(value: Any) -> Any:
    """A deep copy of ``value`` without any ``cache_control`` key (for protocols that do not know it)."""
    if isinstance(value, dict):
        return {k: strip_cache_control(v) for k, v in value.items() if k != CACHE_KEY}
    if isinstance(value, list):
        return [strip_cache_control(v) for v in value]
    return value


def system_text(system: list[Block]) -> str:
    return "\n\n".join(b.get("text", "") for b in system if b.get("type", "text") == "text" and b.get("text"))


def image_data_url(block: Block) -> str:
    return f"data:{block.get('media_type', 'image/png')};base64,{block.get('data', '')}"


def tool_result_text(block: Block) -> str:
    """The text of a canonical tool_result's content (a string is tolerated as well as a block list)."""
    content = block.get("content", [])
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content if b.get("type") == "text")


def tool_result_images(block: Block) -> list[Block]:
    content = block.get("content", [])
    return [] if isinstance(content, str) else [b for b in content if b.get("type") == "image"]


def prompt_chars(request: dict[str, Any]) -> int:
    """The characters of prompt text a request carries (what a token estimate should count): string values
    under the keys a model reads, not the JSON around them, roles, ids or flags."""

    def walk(value: Any, key: str | None, whole: bool) -> int:
        if isinstance(value, str):
            return len(value) if whole or key in _PROMPT_KEYS else 0
        if isinstance(value, dict):
            # An Anthropic tool_use ``input`` is the call's arguments: every string in it is prompt.
            return sum(walk(v, k, whole or (k == "input" and isinstance(v, dict))) for k, v in value.items())
        if isinstance(value, list):
            return sum(walk(v, key, whole) for v in value)
        return 0

    top = ("system", "instructions", "messages", "input", "tools")
    return sum(len(v) if isinstance(v, str) else walk(v, None, False) for k in top if (v := request.get(k)))


def text_or_parts(parts: list[dict[str, Any]], fmt: ContentFormat, *, text_type: str = "text") -> Any:
    """Message content in the configured format: the joined text when ``fmt`` asks for a string (or, for
    ``auto``, when every part is text without a cache breakpoint), else the parts themselves."""
    text_only = all(p.get("type") == text_type and CACHE_KEY not in p for p in parts)
    if fmt is ContentFormat.string or (fmt is ContentFormat.auto and text_only):
        return "\n\n".join(str(p.get("text", "")) for p in parts if p.get("type") == text_type)
    return parts


@dataclass
class _Signature:
    params: frozenset[str]


class BaseProvider:
    """The shared half of every provider; subclasses supply the protocol-specific parts.

    Subclass hooks: ``_resource`` (the SDK resource whose ``create`` is called), ``build_request``,
    ``assemble_stream`` (saved events -> body) and ``read_body`` (body -> ModelResponse).
    """

    protocol: WireProtocol  # set by each subclass; an attribute, as the Provider protocol expects

    def __init__(self, cfg: ProviderConfig, clients: ClientShards) -> None:
        self.cfg = cfg
        # Several SDK clients, each with its own connection pool, a task always on the same one: the HTTP
        # pool scans every connection it holds on each request, which at hundreds of concurrent tasks costs
        # more CPU than everything else in a turn (benchmarks/concurrency.py). Shards keep each pool small;
        # each is made on its first call (flowllm/providers/clients.py).
        self.clients = clients
        self.name: str = cfg.name
        self.model: str = cfg.model
        self.tool_protocol: ToolProtocol = "native" if cfg.tool_protocol == "native" else "xml"
        self.supports_cache_control: bool = False
        self.content_format = ContentFormat(cfg.content_format)
        # Media sent as themselves (degrade_media describes the rest in text); a string-only wire takes none.
        accepts = set() if self.content_format is ContentFormat.string else set(cfg.accepts)
        self.accepted_media: frozenset[str] = frozenset(accepts - {"text"})
        self._signature: _Signature | None = None
        # Requests to this provider now running, and started in total: a stream cut while others ran is
        # reported with its likely cause (a server with one slot ends a stream when the next request comes).
        self._in_flight = 0
        self._started = 0
        # Batch mode (provider.batch): the queue this provider's calls go through instead of one request each.
        self.batcher: Batcher | None = None

    @property
    def client(self) -> Any:
        """The first SDK client (made now if no call has needed it yet)."""
        return self.clients.get(0)

    @property
    def base_url(self) -> str:
        """The endpoint the SDK client calls (named in connection and not-found errors)."""
        if self.clients.base_url:
            return self.clients.base_url
        return str(getattr(self.client, "base_url", None) or self.cfg.base_url or "")

    def prepare(self) -> None:
        """Make the first SDK client and read its method's signature: the SDK's import (about a second of CPU)
        and its client set-up, paid when the provider opens rather than inside the first task's turn."""
        self._params()

    # ----- hooks -----------------------------------------------------------------------------------------
    def _resource(self, client: Any) -> Any:
        """The SDK resource this protocol calls on ``client`` (``client.messages``, ``client.chat.completions``...)."""
        raise NotImplementedError

    def _method(self, client: Any = None) -> Callable[..., Any]:
        """The SDK coroutine function to call, on ``client`` (default: the first one)."""
        return self._resource(client or self.client).create

    def _raw_method(self, client: Any) -> Callable[..., Any]:
        """The same call returning the SDK's raw response (its HTTP response, body read, not parsed)."""
        return self._resource(client).with_raw_response.create

    def client_for(self, context: CallContext) -> Any:
        """The client that carries this task's calls (stable per task, so its connections get reused)."""
        if len(self.clients) == 1:
            return self.clients.get(0)
        return self.clients.get(zlib.crc32(context.task_id.encode()) % len(self.clients))

    def build_request(self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]) -> dict[str, Any]:
        """The wire request: the protocol's (``unshaped_request``), then shaped for the model that receives it
        (fields it refuses dropped or renamed: flowllm/providers/wire/models.py)."""
        request = self.unshaped_request(system=system, messages=messages, tools=tools)
        return self._shape(request)[0]

    def unshaped_request(
        self, *, system: list[Block], messages: list[Message], tools: list[ToolSpec]
    ) -> dict[str, Any]:
        raise NotImplementedError

    def _shape(self, request: dict[str, Any]) -> tuple[dict[str, Any], list[Adjustment]]:
        return shape_request(self.protocol, self.model, request, budget_tokens=int(self.cfg.thinking.budget_tokens))

    def shaping_notes(self) -> list[str]:
        """What ``build_request`` changes for this model whatever the conversation (a dropped temperature, a
        renamed max_tokens), one line each, for the log once per run."""
        unshaped = self.unshaped_request(system=[], messages=[], tools=[])
        return [note.describe(self.name, self.model) for note in self._shape(unshaped)[1]]

    def sendable(self, messages: list[Message]) -> list[Message]:
        """``messages`` with every medium this model does not take replaced by its text description (the
        degrade_media stand-in), so no configuration sends an image to a text-only model."""

        def has_foreign(blocks: list[Block]) -> bool:
            for b in blocks:
                kind = b.get("type")
                if kind in MEDIA_TYPES and kind not in self.accepted_media:
                    return True
                if kind == "tool_result" and isinstance(b.get("content"), list) and has_foreign(b["content"]):
                    return True
            return False

        if not any(has_foreign(m["content"]) for m in messages):
            return messages
        return degrade_messages(messages, set(self.accepted_media))[0]

    def assemble_stream(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        raise NotImplementedError

    def check_stream_events(self, events: list[dict[str, Any]]) -> None:
        """Raise for error events the SDK passed through as ordinary events (the Responses ``error``
        event)."""

    def stream_complete(self, events: list[dict[str, Any]]) -> bool:
        """Whether the stream reached the protocol's final event. A stream cut short by a proxy or a dying
        server ends without an error; reading its events anyway would hand the agent half a reply."""
        return True

    def read_body(self, body: dict[str, Any]) -> tuple[ModelResponse, Usage | None]:
        """The reply, and the server's usage (None when it reported none: normalize then estimates)."""
        raise NotImplementedError

    # ----- shared ----------------------------------------------------------------------------------------
    def _split(self, request: dict[str, Any]) -> dict[str, Any]:
        """SDK keyword arguments: named parameters as such, every other key through ``extra_body``.

        The SDKs type their parameters; keys they do not know (``temperature`` is not a named parameter of
        anthropic 2.x, vendor flags like ``enable_thinking``) would be rejected as keyword arguments.
        """
        params = self._params()
        kwargs: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for key, value in request.items():
            (kwargs if key in params else extra)[key] = value
        if extra:
            kwargs["extra_body"] = extra
        return kwargs

    def _params(self) -> frozenset[str]:
        """The SDK method's named parameters (read once, from the first client)."""
        if self._signature is None:
            params = inspect.signature(self._method()).parameters
            self._signature = _Signature(frozenset(p for p in params if not p.startswith("extra_")))
        return self._signature.params

    @staticmethod
    def context_headers(context: CallContext) -> dict[str, str]:
        headers = {TASK_HEADER: context.task_id, AGENT_HEADER: context.agent, TURN_HEADER: str(context.turn)}
        epoch = current_epoch()
        if epoch is not None:
            headers[EPOCH_HEADER] = str(epoch)
        return headers

    async def send(self, request: dict[str, Any], *, context: CallContext) -> dict[str, Any]:
        running_before = self._in_flight
        self._in_flight += 1
        self._started += 1
        started_before = self._started
        try:
            return await self._send(request, context=context)
        except ProviderCallError as exc:
            # Others running when this one began, still running, or begun since: any overlap counts.
            overlapped = max(running_before, self._in_flight - 1, self._started - started_before)
            if overlapped and exc.kind in (ErrorKind.TRUNCATED, ErrorKind.CONNECTION) and exc.status in (None, 200):
                exc.message += concurrency_hint(overlapped)
            raise
        finally:
            self._in_flight -= 1

    async def _send(self, request: dict[str, Any], *, context: CallContext) -> dict[str, Any]:
        if self.batcher is not None:  # batch mode: the reply body, plus its batch's id
            return await self.batcher.call(request, context)
        kwargs = self._split(request)
        kwargs["extra_headers"] = self.context_headers(context)
        client = self.client_for(context)
        try:
            if request.get("stream"):
                events: list[dict[str, Any]] = []
                stream = await self._method(client)(**kwargs)
                try:
                    async for event in _aiter(stream):
                        events.append(_to_json(event))
                finally:
                    close = getattr(stream, "close", None)
                    if close is not None:
                        await close()
                self.check_stream_events(events)
                if not self.stream_complete(events):
                    last = events[-1].get("type") or events[-1].get("object") if events else None
                    what = (
                        f"{len(events)} events, last: {last}"
                        if events
                        else (
                            "no event at all: the server failed before its first token, see its log; a prompt longer "
                            "than the model's context is a common cause with servers that report errors only then"
                        )
                    )
                    raise ProviderCallError(
                        f"the stream ended before its final event ({what})",
                        kind="truncated",
                        provider=self.name,
                        status=200,
                    )
                raw: dict[str, Any] = {"stream": True, "events": events}
            else:
                raw = self._body(await self._raw_method(client)(**kwargs))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise classify_exception(exc, provider=self.name, url=self.base_url) from exc
        if not _has_prompt_count(raw):
            # Some compatible servers report no usage (or a zero prompt); keep the prompt size so normalize can
            # estimate it, counted on the text the request carried.
            raw[PROMPT_CHARS_KEY] = prompt_chars(request)
        return raw

    def _body(self, response: Any) -> dict[str, Any]:
        """The JSON object a raw SDK response carries (its body was read by the SDK: the call is done)."""
        http = response.http_response
        try:
            body = orjson.loads(http.content)
        except orjson.JSONDecodeError as exc:
            kind = http.headers.get("content-type", "no content type")
            raise ProviderResponseError(
                f"the reply is not JSON ({kind}, {len(http.content)} bytes: {http.content[:80]!r}): {exc}",
                kind="bad_response",
                provider=self.name,
            ) from None
        if not isinstance(body, dict):
            raise ProviderResponseError(
                f"the reply is JSON but not an object (a {type(body).__name__})",
                kind="bad_response",
                provider=self.name,
            )
        return body

    def normalize(self, raw: dict[str, Any]) -> ModelResponse:
        try:
            body = self.assemble_stream(raw.get("events", [])) if raw.get("stream") else raw
            response, usage = self.read_body(body)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ProviderResponseError(
                f"cannot read the {self.protocol} response: {type(exc).__name__}: {exc}",
                kind="bad_response",
                provider=self.name,
            ) from exc
        response.usage = usage_or_estimate(usage, prompt_chars=int(raw.get(PROMPT_CHARS_KEY, 0)), reply=response)
        if not response.text and not response.tool_calls and not response.content_blocks:
            raise ProviderResponseError(
                f"the model returned an empty reply (stop_reason={response.stop_reason!r})",
                kind="empty_reply",
                provider=self.name,
                usage=response.usage,  # read and answered: billed, though of no use
            )
        return response

    async def aclose(self) -> None:
        if self.batcher is not None:
            await self.batcher.aclose()
        for client in self.clients.made():
            close = getattr(client, "close", None)
            if close is not None:
                await close()

    def __repr__(self) -> str:  # never shows the client (and with it the key)
        return f"{type(self).__name__}(name={self.name!r}, model={self.model!r}, protocol={self.protocol!r})"


def _to_json(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    to_dict = getattr(obj, "to_dict", None)
    if to_dict is None:
        raise ProviderResponseError(f"unexpected SDK object {type(obj).__name__}", kind="bad_response")
    result = to_dict(mode="json")
    assert isinstance(result, dict)
    return result


def _has_prompt_count(value: Any) -> bool:
    """Whether any usage object in a raw reply (a body, or its stream events) counts prompt tokens above 0."""
    if isinstance(value, dict):
        usage = value.get("usage")
        if isinstance(usage, dict) and any(
            isinstance(usage.get(k), int) and usage[k] > 0
            for k in ("prompt_tokens", "input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
        ):
            return True
        return any(_has_prompt_count(v) for v in value.values() if isinstance(v, dict | list))
    if isinstance(value, list):
        return any(_has_prompt_count(v) for v in value)
    return False


def concurrency_hint(others: int) -> str:
    """What to say when a stream or connection broke while other requests to the same server ran."""
    return (
        f"; {others} other request(s) to this server were in flight: some servers (llama-cpp-python's, with "
        "interrupt_requests) end a running stream when the next request arrives. "
        "Set provider.rate_limit.max_in_flight=1, "
        "or give the server more slots (llama-server --parallel N, vLLM and SGLang batch) and raise it to match"
    )


async def _aiter(stream: Any) -> AsyncIterator[Any]:
    async for item in stream:
        yield item


def usage_or_estimate(usage: Usage | None, *, prompt_chars: int, reply: ModelResponse) -> Usage:
    """The server's usage, or an estimate marked ``estimated`` when the server reported none.

    A count of zero that cannot be true (no prompt tokens for a prompt with text in it, no output tokens for
    a reply with text in it) is replaced by its estimate, and the whole usage is marked ``estimated``."""
    out = len(reply.text) + len(reply.thinking) + sum(len(c.arguments) + len(c.name) for c in reply.tool_calls)
    if usage is None:
        return Usage(
            input_tokens=math.ceil(prompt_chars / 4),
            output_tokens=math.ceil(out / 4),
            reasoning_tokens=estimate_tokens(reply.thinking),
            estimated=True,
        )
    if usage.input_tokens == 0 and prompt_chars > 0:
        usage.input_tokens = math.ceil(prompt_chars / 4)
        usage.estimated = True
    if usage.output_tokens == 0 and out > 0:
        usage.output_tokens = math.ceil(out / 4)
        usage.estimated = True
    return usage
