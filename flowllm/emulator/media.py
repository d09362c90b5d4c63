"""The emulator's audio endpoint: ``POST /v1/audio/transcriptions`` (the OpenAI wire shape) answered from the
script, so tool-audio runs offline through the official SDK.

The transcript of a file is the text of the script entry ``tasks: {"transcribe/<file name>": [{text: ...}]}``
(the file name the client uploads); a file the script does not know is a 400 in OpenAI's error shape, so a
missing transcript fails the call instead of inventing words.
"""

from __future__ import annotations

from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from flowllm.emulator.script import Script

TRANSCRIBE_PREFIX = "transcribe/"


def _error(message: str, status: int = 400, code: str | None = None) -> JSONResponse:
    body = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return JSONResponse(body, status_code=status)


def routes(script: Script) -> list[Route]:
    async def transcriptions(request: Request) -> Response:
        if not request.headers.get("authorization", "").lower().startswith("bearer "):
            return _error("authentication required: send an API key", 401, "invalid_api_key")
        form = await request.form()
        upload = form.get("file")
        if not isinstance(upload, UploadFile) or not form.get("model"):
            return _error("'file' and 'model' are required form fields")
        data = await upload.read()
        name = upload.filename or ""
        entries = script.tasks.get(TRANSCRIBE_PREFIX + name)
        if not entries:
            return _error(f"the emulator script has no transcript for '{name}' (tasks.{TRANSCRIBE_PREFIX}{name})")
        text = entries[0].text.strip()
        if form.get("response_format") == "text":
            return PlainTextResponse(text)
        seconds = max(len(data) / 32000, 0.1)  # 16 kHz 16-bit mono: what the usage block reports
        return JSONResponse({"text": text, "usage": {"type": "duration", "seconds": round(seconds, 2)}})

    return [Route("/v1/audio/transcriptions", transcriptions, methods=["POST"])]
