"""core/hub.hub_unreachable: decided from the offline switches, a proxy, or one local TCP connection (no network)."""

from __future__ import annotations

import socket

import pytest

from eglr_harness.core import hub

pytestmark = pytest.mark.unit

_SWITCHES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*_SWITCHES, *_PROXIES):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed once the with block ends: a connection there is refused


@pytest.mark.parametrize("switch", _SWITCHES)
def test_an_offline_switch_is_the_reason(clean_env, switch):
    clean_env.setenv(switch, "1")
    assert hub.hub_unreachable() == f"{switch}=1 is set"


def test_an_endpoint_that_refuses_is_unreachable(clean_env):
    port = _closed_port()
    clean_env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert hub.hub_unreachable(timeout_s=2) == f"127.0.0.1:{port} cannot be reached (Connection refused)"


def test_an_endpoint_that_listens_is_reachable(clean_env):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        clean_env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
        assert hub.hub_unreachable(timeout_s=2) is None


@pytest.mark.parametrize("proxy, scheme", [("HTTP_PROXY", "http"), ("https_proxy", "https"), ("ALL_PROXY", "http")])
def test_behind_a_proxy_a_refused_direct_connection_proves_nothing(clean_env, proxy, scheme):
    # the load reaches the hub through the proxy: refusing it from a direct connection would refuse a user
    # whose hub works
    clean_env.setenv("HF_ENDPOINT", f"{scheme}://127.0.0.1:{_closed_port()}")
    clean_env.setenv(proxy, "http://proxy.invalid:3128")
    assert hub.hub_unreachable(timeout_s=2) is None


def test_a_proxy_for_the_other_scheme_does_not_count(clean_env):
    clean_env.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    clean_env.setenv("HTTPS_PROXY", "http://proxy.invalid:3128")
    assert hub.hub_unreachable(timeout_s=2) is not None
