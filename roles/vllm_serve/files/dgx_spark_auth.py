# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The API key on every route of vLLM's OpenAI server, loaded with ``--middleware``.

vLLM's own ``--api-key`` guards the /v1 routes only; this middleware refuses every HTTP
request without ``Authorization: Bearer <key>`` except the public paths (``/health``, and
``/metrics`` when the owner says so). The key and the public paths are read once from
``auth.json`` beside this file (mode 0600, written by the vllm_serve role), so the key is in
neither the process arguments nor the environment, and vLLM's Ray executor, which copies the
driver's environment to its actors, never carries it to the ranks.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path

CONFIG = Path(__file__).resolve().with_name("auth.json")


def load(path: Path = CONFIG) -> tuple[str, frozenset[str]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    return str(data["key"]), frozenset(data.get("public", ["/health"]))


def authorized(path: str, header: str | None, key: str, public: frozenset[str]) -> bool:
    """Whether a request for ``path`` with this Authorization header may pass."""
    if path in public:
        return True
    scheme, _sep, presented = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not presented:
        return False
    return hmac.compare_digest(presented.strip().encode(), key.encode())


# No configuration, no server: a missing or unreadable auth.json fails vLLM's start.
_KEY, _PUBLIC = load()


async def require_key(request, call_next):
    """Starlette HTTP middleware: 401 unless the request is public or carries the key."""
    if not authorized(request.url.path, request.headers.get("authorization"), _KEY, _PUBLIC):
        from starlette.responses import JSONResponse

        return JSONResponse(
            {"error": {"message": "Unauthorized", "type": "invalid_request_error", "code": 401}},
            status_code=401,
        )
    return await call_next(request)
