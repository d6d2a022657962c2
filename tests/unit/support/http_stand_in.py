"""A real HTTP server on loopback for the tests of what talks to vLLM's endpoint: each test
says how it answers (``respond``), and the server keeps every request it got."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# respond(method, path, headers, body) -> (status, body, content type); a body that is not
# text or bytes is sent as JSON.
Respond = Callable[[str, str, dict, object], tuple[int, object, str]]


class HttpStandIn:
    def __init__(self, respond: Respond):
        self.requests: list[dict] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                headers = dict(self.headers)
                stand_in.requests.append({"method": self.command, "path": self.path,
                                          "headers": headers, "body": body})  # fmt: skip
                status, answer, kind = respond(self.command, self.path, headers, body)
                if isinstance(answer, str):
                    answer = answer.encode()
                data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _answer  # noqa: N815

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
