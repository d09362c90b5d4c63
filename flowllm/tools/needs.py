"""What a built-in tool server needs to work, checked when it starts; and how it says what it cannot do.

A tool whose parser library is missing, or installed but failing to import (trafilatura without
``lxml_html_clean``), must not look like a working tool that answers every call with an error: the model would
be scored on a tool that never worked. So each built-in server checks its needs at start and marks, in its own
tool listing, each tool that cannot work (``_meta["flowllm/unavailable"]``: why, and the line to install) or
that works only in part (``_meta["flowllm/limited"]``). The pool (``connection.ServerHandle``) offers the model
only the tools that can work and the run reports the rest once, before the first task: on the console, in
``app.log`` and in ``summary.json`` → ``tools.unavailable``.

A check must be cheap, since it runs in every server start: a module that imports quickly is imported for real
(so a broken install is caught, not only a missing one); a heavy one (markitdown loads an ONNX model's runtime,
seconds of CPU) is only looked up (``importlib.util.find_spec``), and its own readers still report a failed
load at the call, as an infrastructure failure.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from flowllm.core.types import InfraCause

INFRA_META_KEY = "flowllm/infra"  # an error result's cause, when it is not the model's (core.types.InfraCause)
UNAVAILABLE_META_KEY = "flowllm/unavailable"  # a listed tool that cannot work here: not offered to the model
LIMITED_META_KEY = "flowllm/limited"  # a listed tool offered, but part of what it does cannot work here
DOCS_INSTALL = "pip install 'flowllm[docs]'"


class Check(Enum):
    IMPORT = "import"  # imported for real: catches a broken install too
    FIND = "find"  # looked up only: for modules too heavy to import at every server start


@dataclass(frozen=True)
class Need:
    module: str
    install: str
    check: Check = Check.IMPORT


# The document readers behind read_file and read_url (markitdown's converters and the libraries they load).
DOCUMENT_NEEDS = (
    Need("markitdown", DOCS_INSTALL, Check.FIND),
    Need("pdfminer", DOCS_INSTALL, Check.FIND),
    Need("pdfplumber", DOCS_INSTALL, Check.FIND),
    Need("mammoth", DOCS_INSTALL, Check.FIND),
    Need("openpyxl", DOCS_INSTALL, Check.FIND),
    Need("pandas", DOCS_INSTALL, Check.FIND),
    Need("pptx", DOCS_INSTALL, Check.FIND),
    Need("bs4", DOCS_INSTALL, Check.FIND),
)
# A web page's main content (tool-browse): trafilatura imports lxml.html.clean, the piece pip may skip.
PAGE_NEEDS = (Need("trafilatura", DOCS_INSTALL), *DOCUMENT_NEEDS)
# The transcription client of tool-audio.
TRANSCRIPTION_NEEDS = (Need("openai", "pip install -e . (openai is a dependency of flowllm)", Check.FIND),)


def _problem(need: Need) -> str | None:
    if need.check is Check.FIND:
        try:
            found = importlib.util.find_spec(need.module) is not None
        except (ImportError, ValueError):
            found = False
        return None if found else "is not installed"
    try:
        importlib.import_module(need.module)
    except Exception as exc:  # an installed module may fail in any way while importing its own dependencies
        first = str(exc).splitlines()[0] if str(exc) else ""
        return f"does not import ({type(exc).__name__}{': ' + first if first else ''})"
    return None


def unmet(needs: Iterable[Need], purpose: str) -> str | None:
    """Why ``purpose`` cannot work here (the first need that fails, and the line to install), or None."""
    for need in needs:
        problem = _problem(need)
        if problem is not None:
            return f"{purpose} needs {need.module}, which {problem}: {need.install}"
    return None


def withdrawn_meta(reason: str) -> dict[str, Any]:
    """The ``meta`` of a tool listed but not to be offered: it cannot work here, for ``reason``."""
    return {UNAVAILABLE_META_KEY: reason}


def limited_meta(reason: str) -> dict[str, Any]:
    """The ``meta`` of a tool offered though part of it cannot work here, for ``reason``."""
    return {LIMITED_META_KEY: reason}


def _meta_text(tool: Any, key: str) -> str | None:
    meta = getattr(tool, "meta", None) or {}
    value = meta.get(key) if isinstance(meta, Mapping) else None
    return value if isinstance(value, str) and value else None


def tool_withdrawn(tool: Any) -> str | None:
    """Client side: why a listed tool cannot work (its server says so), or None."""
    return _meta_text(tool, UNAVAILABLE_META_KEY)


def tool_limited(tool: Any) -> str | None:
    """Client side: what part of a listed tool cannot work, or None."""
    return _meta_text(tool, LIMITED_META_KEY)


def infra_meta(cause: InfraCause) -> dict[str, Any]:
    """The ``_meta`` of an error result that failed for an infrastructure reason, not the model's."""
    return {INFRA_META_KEY: cause.value}


def result_infra(result: Any) -> InfraCause | None:
    """Client side: the infrastructure cause a server gave an error result, or None (the model's call)."""
    value = _meta_text(result, INFRA_META_KEY)
    try:
        return InfraCause(value) if value else None
    except ValueError:
        return None


def absent_modules(needs: Iterable[Need]) -> list[str]:
    """Every need that fails here, as ``module: why`` (the install check's test and the CLI report use it)."""
    found = []
    for need in needs:
        problem = _problem(need)
        if problem is not None:
            found.append(f"{need.module}: {problem}")
    return found
