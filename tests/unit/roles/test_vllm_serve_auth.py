"""roles/vllm_serve/files/dgx_spark_auth.py: the key on every route but the public ones."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import sys
import types
from pathlib import Path

import pytest

SOURCE = (
    Path(__file__).resolve().parents[3] / "roles" / "vllm_serve" / "files" / "dgx_spark_auth.py"
)
KEY = "sk-test-0123456789"


def load_middleware(tmp_path, config: dict | None):
    """The middleware as the serving container imports it: auth.json beside the file."""
    shutil.copy(SOURCE, tmp_path / "dgx_spark_auth.py")
    if config is not None:
        (tmp_path / "auth.json").write_text(json.dumps(config))
    spec = importlib.util.spec_from_file_location(
        f"auth_{tmp_path.name}", tmp_path / "dgx_spark_auth.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("path", "header", "public", "allowed"),
    [
        ("/health", None, {"/health"}, True),
        ("/metrics", None, {"/health"}, False),
        ("/metrics", None, {"/health", "/metrics"}, True),
        ("/v1/models", f"Bearer {KEY}", {"/health"}, True),
        ("/v1/models", f"bearer {KEY}", {"/health"}, True),
        ("/v1/models", "Bearer wrong", {"/health"}, False),
        ("/v1/models", KEY, {"/health"}, False),
        ("/tokenize", "Bearer ", {"/health"}, False),
        ("/version", None, {"/health"}, False),
    ],
)
def test_authorized(tmp_path, path, header, public, allowed):
    auth = load_middleware(tmp_path, {"key": KEY, "public": ["/health"]})
    assert auth.authorized(path, header, KEY, frozenset(public)) is allowed


def test_no_configuration_no_server(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_middleware(tmp_path, None)


class Request:
    def __init__(self, path, headers):
        self.url = type("URL", (), {"path": path})()
        self.headers = headers


class JSONResponse:
    """Starlette's JSONResponse as far as the middleware uses it (the venv has no Starlette)."""

    def __init__(self, content, status_code):
        self.body = json.dumps(content).encode()
        self.status_code = status_code


def test_require_key_answers_401_or_passes_on(tmp_path, monkeypatch):
    responses = types.ModuleType("starlette.responses")
    responses.JSONResponse = JSONResponse
    monkeypatch.setitem(sys.modules, "starlette", types.ModuleType("starlette"))
    monkeypatch.setitem(sys.modules, "starlette.responses", responses)
    auth = load_middleware(tmp_path, {"key": KEY, "public": ["/health", "/metrics"]})

    async def call_next(request):
        return "served"

    def ask(path, headers):
        return asyncio.run(auth.require_key(Request(path, headers), call_next))

    assert ask("/metrics", {}) == "served"
    assert ask("/v1/completions", {"authorization": f"Bearer {KEY}"}) == "served"
    refused = ask("/v1/completions", {})
    assert refused.status_code == 401
    assert json.loads(refused.body)["error"]["code"] == 401
