"""A stand-in Docker Engine API on a Unix socket, answering the read-only calls that
community.docker's docker_host_info, docker_image_info and docker_container_info make: the
version, the host's info, the container list, one container's inspect, the image search by
reference and one image's inspect. Point ``DOCKER_HOST`` at ``unix://<socket>``."""

from __future__ import annotations

import json
import os
import socketserver
import tempfile
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, unquote, urlparse

VERSION = "26.1.5"


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    containers: list[dict] = []
    images: list[dict] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def address_string(self):
        return "local"

    def log_message(self, *args):
        pass

    def _send(self, code: int, body) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _image(self, key: str) -> dict | None:
        for image in self.server.images:
            if key in (image["Id"], image["Id"].removeprefix("sha256:")) or key in image.get(
                "RepoTags", []
            ):
                return image
        return None

    def do_GET(self):  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        if path.endswith("/version"):
            return self._send(200, {"ApiVersion": "1.41", "Version": VERSION})
        if path.endswith("/_ping"):
            return self._send(200, "OK")
        if path.endswith("/info"):
            return self._send(200, {"ServerVersion": VERSION, "Name": "stand-in"})
        if path.endswith("/containers/json"):
            return self._send(200, self.server.containers)
        if "/containers/" in path and path.endswith("/json"):
            key = path.split("/containers/", 1)[1].removesuffix("/json")
            for entry in self.server.containers:
                if key == entry["Id"] or f"/{key}" in entry["Names"]:
                    return self._send(200, entry["inspect"])
            return self._send(404, {"message": f"No such container: {key}"})
        if path.endswith("/images/json"):
            filters = json.loads((query.get("filters") or ["{}"])[0])
            wanted = list(filters.get("reference") or [])
            found = [
                {k: v for k, v in image.items() if k in ("Id", "RepoTags", "RepoDigests")}
                for image in self.server.images
                if not wanted
                or any(tag.rsplit(":", 1)[0] in wanted for tag in image.get("RepoTags", []))
            ]
            return self._send(200, found)
        if "/images/" in path and path.endswith("/json"):
            image = self._image(path.split("/images/", 1)[1].removesuffix("/json"))
            return self._send(*((200, image) if image else (404, {"message": "No such image"})))
        return self._send(404, {"message": f"not served here: {path}"})


@contextmanager
def docker_api(containers: list[dict] = (), images: list[dict] = ()):
    """Serve ``containers`` (each with ``Id``, ``Names``, ``State``, ``Labels`` and the
    ``inspect`` answer) and ``images`` (inspect answers) until the block ends; yields the
    ``DOCKER_HOST`` value."""
    # A short directory: a Unix socket's path is limited to about 100 bytes.
    with tempfile.TemporaryDirectory(prefix="dgxcap") as directory:
        server = _Server(os.path.join(directory, "docker.sock"), _Handler)
        server.containers = list(containers)
        server.images = list(images)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"unix://{server.server_address}"
        finally:
            server.shutdown()
            server.server_close()
