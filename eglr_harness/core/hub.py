"""Whether the Hugging Face hub can be asked, decided in seconds: before a model or dataset load that would retry an
unreachable hub for a minute and end in a traceback.

``huggingface_hub`` (and ``datasets``) retry a failed request five times with backoff (~80 s for a verifier's
files) and then raise from deep inside the load. :func:`hub_unreachable` answers first, from the offline switches
or one TCP connection to the hub's endpoint with a short timeout; :func:`cached_model_file` says whether a model's
file is in the local cache, which the loads use without the hub.
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

__all__ = ["cached_model_file", "hub_unreachable"]

_TRUE = {"1", "ON", "YES", "TRUE"}
PROBE_TIMEOUT_S = 5.0
# the variables through which requests (hence huggingface_hub and datasets) reach an https / an http endpoint
_PROXY_VARIABLES = {False: ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"),
                    True: ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")}


def hub_unreachable(timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot be asked now (an offline switch, or its endpoint refusing a connection), else None."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        if os.environ.get(name, "").strip().upper() in _TRUE:
            return f"{name}={os.environ[name]} is set"
    endpoint = os.environ.get("HF_ENDPOINT", "").strip() or "https://huggingface.co"
    parsed = urlparse(endpoint)
    if any(os.environ.get(name, "").strip() for name in _PROXY_VARIABLES[parsed.scheme == "http"]):
        return None  # behind a proxy a direct connection proves nothing: let the load ask the hub its own way
    host, port = parsed.hostname or "huggingface.co", parsed.port or (80 if parsed.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as err:
        return f"{host}:{port} cannot be reached ({err.strerror or err})"
    return None


def cached_model_file(repo_id: str, filename: str = "config.json") -> bool:
    """Whether ``filename`` of the hub model ``repo_id`` is in the local cache (``HF_HOME``/``HF_HUB_CACHE``)."""
    try:
        from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(repo_id, filename)
    except Exception:  # an id the hub's rules refuse: not cached under it either  # noqa: BLE001
        return False
    return isinstance(found, str)
