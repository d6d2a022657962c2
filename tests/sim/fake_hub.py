"""A stand-in for the Hugging Face Hub on a simulated node (the pair has no internet).

Serves one repository from a directory with the endpoints huggingface_hub and the
model_cache role use: model info (``/api/models/<repo>/revision/<rev>``), the file tree
(``/api/models/<repo>/tree/<rev>``) and file downloads (``/<repo>/resolve/<rev>/<file>``,
with the ETag and X-Repo-Commit headers the client reads). Every request must carry the
token as a bearer token, as for a gated repository; each request is logged with whether
it did.

    python3 fake_hub.py <dir> <port> <repo> <commit> <token>
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT, PORT, REPO, COMMIT, TOKEN = sys.argv[1], int(sys.argv[2]), *sys.argv[3:6]
FILES = {
    name: open(os.path.join(ROOT, name), "rb").read()  # noqa: SIM115
    for name in sorted(os.listdir(ROOT))
    if not name.startswith(".")
}


def sibling(name: str, data: bytes) -> dict:
    entry = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
    if name == "tokenizer.json":  # the largest file goes through LFS, as weights do
        entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
        entry["size"] = 134
    return entry


class Hub(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        authorized = self.headers.get("Authorization") == f"Bearer {TOKEN}"
        sys.stderr.write(f"authorized={authorized} {fmt % args}\n")
        sys.stderr.flush()

    def send(self, body: bytes, headers: dict, head: bool) -> None:
        self.send_response(200)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802
        self.do_GET(head=True)

    def do_GET(self, head: bool = False):  # noqa: N802
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_response(401)
            self.end_headers()
            return
        path = self.path.split("?", 1)[0]
        as_json = {"Content-Type": "application/json"}
        if path.startswith(f"/api/models/{REPO}/revision/"):
            siblings = [sibling(n, d) for n, d in FILES.items()]
            info = {"id": REPO, "sha": COMMIT, "gated": "manual", "siblings": siblings}
            return self.send(json.dumps(info).encode(), as_json, head)
        if path.startswith(f"/api/models/{REPO}/tree/"):
            tree = [
                {"type": "file", "path": n, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                for n, d in FILES.items()
            ]
            return self.send(json.dumps(tree).encode(), as_json, head)
        prefix = f"/{REPO}/resolve/"
        if path.startswith(prefix):
            name = path[len(prefix) :].split("/", 1)[-1]
            if name in FILES:
                etag = hashlib.sha256(FILES[name]).hexdigest()
                headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"'}
                return self.send(FILES[name], headers, head)
        self.send_response(404)
        self.end_headers()


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", PORT), Hub).serve_forever()
