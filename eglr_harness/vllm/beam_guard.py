"""The served engine's refusal of EGLR settings on vLLM's beam-search routes: an ASGI middleware that
``python -m eglr_harness.vllm.serve`` hands vLLM's server (its own ``--middleware`` option).

vLLM's OpenAI server runs a request with ``use_beam_search`` through its own beam search, which builds its own
``SamplingParams`` for each step without the request's ``vllm_xargs`` (``to_beam_search_params``): the row-settings
processor never sees the request, so its EGLR settings would be dropped without a word (plain beam texts, HTTP 200),
its bad values and tag unchecked. This middleware answers such a request with HTTP 400 in one line, in vLLM's own
error body, before vLLM reads it; every other request passes through untouched (its body replayed as it came). It is
in no engine but the one that names it: installing the project changes nothing for other servers.
"""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

# what marks a request body worth parsing (cheap byte checks before any JSON is read)
_MARKERS = (b"use_beam_search", b"eglr")
_FALSE = {"0", "false", "f", "no", "n", "off"}  # pydantic's lax bool: the strings that mean False


def beam_refusal(body: bytes) -> str | None:
    """The one-line refusal of a JSON request body that asks for beam search with EGLR settings in ``vllm_xargs``
    (the flat ``eglr_*`` keys or ``eglr``); None for any other body (malformed ones included: vLLM answers those)."""
    if not all(marker in body for marker in _MARKERS):
        return None
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(payload, dict) or not _truthy(payload.get("use_beam_search")):
        return None
    xargs = payload.get("vllm_xargs")
    keys = sorted(key for key in xargs if isinstance(key, str) and (key == "eglr" or key.startswith("eglr_"))) \
        if isinstance(xargs, dict) else []
    if not keys:
        return None
    return (f"`use_beam_search`=true with EGLR settings (vllm_xargs {keys[0]}) is not allowed; allowed: EGLR without "
            "beam search, or beam search without eglr_* keys (vLLM's beam search drops vllm_xargs: EGLR would not "
            "run).")


def _truthy(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in _FALSE and value.strip() != ""
    return bool(value)


class RefuseEglrBeamSearch:
    """Pure ASGI middleware: HTTP 400 (``beam_refusal``'s line, vLLM's ``ErrorResponse`` body) for a JSON POST that asks
    for beam search with EGLR settings; anything else reaches vLLM's app as it came."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        messages, body = [], b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        refusal = beam_refusal(body)
        if refusal is not None:
            error = {"message": refusal, "type": "BadRequestError", "param": "use_beam_search", "code": 400}
            await JSONResponse({"error": error}, status_code=400)(scope, receive, send)
            return

        async def replay():
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

