#!/usr/bin/env python3
"""Fetch vLLM's published source archives (``vllm-<version>.tar.gz``) and read them.

Standard library only. The package index is the one pip is configured with
(``PIP_INDEX_URL`` or ``index-url`` in pip's configuration), else pip's own default,
taken from pip at run time so that no index host name is written here.

The index is asked through its simple API (PEP 691 JSON, with a PEP 503 HTML fallback),
the archive is checked against the sha256 the index publishes and kept in a cache
directory: ``$DGX_SPARK_CACHE/vllm-sdist`` if that variable is set, else
``<repo>/.cache/vllm-sdist``. A cached archive whose recorded sha256 (sidecar file
``<archive>.sha256``) still matches is used without any network access.

Usage::

    python3 tools/vllm_sdist.py fetch VERSION          # prints the archive's path
    python3 tools/vllm_sdist.py extract VERSION DEST   # DEST/vllm/__init__.py, prints DEST
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import posixpath
import re
import shutil
import ssl
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from html.parser import HTMLParser
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROJECT = "vllm"
JSON_ACCEPT = "application/vnd.pypi.simple.v1+json"
ACCEPT = f"{JSON_ACCEPT}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
TIMEOUT_S = 120
CHUNK = 1 << 20
_VERSION_RE = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]*")


class SdistError(Exception):
    """Anything that keeps us from producing a verified archive or its contents."""


# --------------------------------------------------------------------------- pip settings


def _pip_config() -> dict[str, str]:
    """``python3 -m pip config list`` as a dict (empty when pip cannot tell)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    if proc.returncode != 0:
        return {}
    return parse_pip_config(proc.stdout)


def parse_pip_config(text: str) -> dict[str, str]:
    """Parse ``pip config list`` output (lines ``section.key='value'``)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if not sep:
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def _from_config(config: dict[str, str], name: str) -> str | None:
    # pip's own precedence: environment, then the command's section, then global.
    for key in (f":env:.{name}", f"install.{name}", f"download.{name}", f"global.{name}"):
        value = config.get(key, "").strip()
        if value:
            return value.split()[0]
    return None


def _default_index() -> str:
    try:
        from pip._internal.models.index import PyPI
    except ImportError as exc:  # pragma: no cover - depends on the interpreter
        raise SdistError(
            "no package index configured (PIP_INDEX_URL / pip config index-url) and pip "
            f"is not importable to tell its default: {exc}"
        ) from exc
    return PyPI.simple_url


def index_url(config: dict[str, str] | None = None) -> str:
    """The simple-API base URL to ask, always ending in ``/``."""
    url = os.environ.get("PIP_INDEX_URL", "").strip().split()
    if url:
        base = url[0]
    else:
        if config is None:
            config = _pip_config()
        base = _from_config(config, "index-url") or _default_index()
    return base.rstrip("/") + "/"


def ssl_context(config: dict[str, str] | None = None) -> ssl.SSLContext:
    """An SSL context using pip's configured CA bundle, if any."""
    cafile = os.environ.get("PIP_CERT", "").strip()
    if not cafile:
        if config is None:
            config = _pip_config()
        cafile = _from_config(config, "cert") or ""
    if cafile:
        if not os.path.exists(cafile):
            raise SdistError(f"pip's configured CA bundle {cafile!r} does not exist")
        return ssl.create_default_context(cafile=cafile)
    return ssl.create_default_context()


# --------------------------------------------------------------------------- index parsing


class _AnchorParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str]] = []  # (href, text)
        self._href: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self._href = dict(attrs).get("href") or ""
            self._text = []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.links.append((self._href, "".join(self._text).strip()))
            self._href = None


def parse_index(body: bytes, content_type: str, page_url: str) -> dict[str, dict]:
    """Files listed on a project page: filename -> {"url": absolute URL, "hashes": {...}}.

    Understands PEP 691 JSON and PEP 503 HTML (hash in the URL fragment).
    """
    files: dict[str, dict] = {}
    ctype = content_type.split(";")[0].strip().lower()
    if ctype.endswith("json") or body.lstrip()[:1] == b"{":
        try:
            data = json.loads(body)
            entries = data["files"]
        except (ValueError, KeyError, TypeError) as exc:
            raise SdistError(f"{page_url}: not a PEP 691 project page: {exc}") from exc
        for entry in entries:
            name = entry.get("filename")
            url = entry.get("url")
            if not name or not url:
                continue
            url = urllib.parse.urldefrag(urllib.parse.urljoin(page_url, url)).url
            hashes = dict(entry.get("hashes") or {})
            files[name] = {"url": url, "hashes": hashes, "yanked": entry.get("yanked", False)}
        return files
    parser = _AnchorParser()
    parser.feed(body.decode("utf-8", "replace"))
    for href, text in parser.links:
        url, frag = urllib.parse.urldefrag(urllib.parse.urljoin(page_url, href))
        name = text or posixpath.basename(urllib.parse.urlparse(url).path)
        hashes = {}
        algo, sep, digest = frag.partition("=")
        if sep and algo and digest:
            hashes[algo] = digest
        files[name] = {"url": url, "hashes": hashes, "yanked": False}
    return files


def pick_sdist(files: dict[str, dict], version: str) -> tuple[str, str, str]:
    """(filename, url, sha256) of ``vllm-<version>.tar.gz`` among the listed files."""
    name = sdist_name(version)
    entry = files.get(name)
    if entry is None:
        near = sorted((f for f in files if f.endswith(".tar.gz")), key=_natural)[-5:]
        raise SdistError(f"{name} is not on the index (newest source archives listed: {near})")
    digest = str(entry["hashes"].get("sha256", "")).lower()
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise SdistError(f"the index gives no sha256 for {name}; refusing an unverified file")
    return name, entry["url"], digest


def _natural(text: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def sdist_name(version: str) -> str:
    if not _VERSION_RE.fullmatch(version) or ".." in version:
        raise SdistError(f"not a version string: {version!r}")
    return f"{PROJECT}-{version}.tar.gz"


# --------------------------------------------------------------------------- fetching


def default_cache_dir() -> Path:
    base = os.environ.get("DGX_SPARK_CACHE", "").strip()
    if base:
        return Path(base) / "vllm-sdist"
    return REPO_ROOT / ".cache" / "vllm-sdist"


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise


def _unlink(path: str | Path) -> None:
    Path(path).unlink(missing_ok=True)


def _recorded(archive: Path) -> str | None:
    sidecar = archive.with_name(archive.name + ".sha256")
    try:
        text = sidecar.read_text().split()
    except OSError:
        return None
    return text[0].lower() if text else None


def _open(url: str, context: ssl.SSLContext, accept: str | None = None):
    headers = {"User-Agent": "dgx-spark-vllm-sdist/1"}
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(url, headers=headers)
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S, context=context)
    except urllib.error.HTTPError as exc:
        raise SdistError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SdistError(f"{url}: cannot connect: {reason}") from exc


def fetch_sdist(version: str, cache_dir: Path | None = None) -> Path:
    """Path of the verified ``vllm-<version>.tar.gz``, downloading it if not cached."""
    name = sdist_name(version)
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    archive = cache / name
    recorded = _recorded(archive)
    if recorded and archive.is_file() and sha256_file(archive) == recorded:
        return archive

    # Ask pip only when the environment does not already say both things we need.
    env_says_all = os.environ.get("PIP_INDEX_URL") and os.environ.get("PIP_CERT")
    config = {} if env_says_all else _pip_config()
    context = ssl_context(config)
    page = index_url(config) + PROJECT + "/"
    with _open(page, context, ACCEPT) as resp:
        try:
            body = resp.read()
        except OSError as exc:
            raise SdistError(f"{page}: reading failed: {exc}") from exc
        ctype = resp.headers.get("Content-Type", "")
    _, url, expected = pick_sdist(parse_index(body, ctype, page), version)

    cache.mkdir(parents=True, exist_ok=True)
    if archive.is_file() and sha256_file(archive) == expected:
        _write_text_atomic(archive.with_name(name + ".sha256"), f"{expected}  {name}\n")
        return archive

    fd, tmp = tempfile.mkstemp(dir=cache, prefix=f".{name}.", suffix=".part")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out, _open(url, context) as resp:
            try:
                for chunk in iter(lambda: resp.read(CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
            except OSError as exc:
                raise SdistError(f"{url}: download interrupted: {exc}") from exc
        got = digest.hexdigest()
        if got != expected:
            raise SdistError(f"{name}: sha256 mismatch: index says {expected}, downloaded {got}")
        os.chmod(tmp, 0o644)
        os.replace(tmp, archive)
    except BaseException:
        _unlink(tmp)
        raise
    _write_text_atomic(archive.with_name(name + ".sha256"), f"{expected}  {name}\n")
    return archive


# --------------------------------------------------------------------------- archive reading


def member_relpath(name: str) -> str | None:
    """Path of a member below the archive's top directory, or None if unsafe/irrelevant.

    ``vllm-1.0/vllm/x.py`` -> ``vllm/x.py``; absolute names, ``..`` parts, backslashes
    and names without a top directory give None.
    """
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if len(parts) < 2 or any(p == ".." for p in parts):
        return None
    if re.match(r"^[A-Za-z]:", parts[0]):
        return None
    return "/".join(parts[1:])


def _check_archive(archive: Path) -> None:
    if not Path(archive).is_file():
        raise SdistError(f"{archive}: no such archive")


def read_member(archive: Path, relpath: str) -> str:
    """Text of ``<top>/<relpath>`` in the archive (e.g. ``vllm/model_executor/...``)."""
    _check_archive(archive)
    want = relpath.strip("/")
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                if member.isfile() and member_relpath(member.name) == want:
                    fh = tar.extractfile(member)
                    if fh is None:  # pragma: no cover - isfile() members always have data
                        break
                    return fh.read().decode("utf-8")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise SdistError(f"{archive}: unreadable archive: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise SdistError(f"{archive}: {want} is not UTF-8 text: {exc}") from exc
    raise SdistError(f"{archive}: no member {want!r}")


def package_relpath(name: str) -> str | None:
    """For a member name, its path below ``vllm/`` if it belongs to the package tree."""
    rel = member_relpath(name)
    if rel is None:
        return None
    parts = rel.split("/")
    if parts[0] != PROJECT or "__pycache__" in parts:
        return None
    return rel


def extract_package(archive: Path, dest: Path, *, replace: bool = False) -> Path:
    """Extract only the ``vllm/`` package tree of the archive into ``dest/vllm``.

    Only regular files and directories are written (links and devices are skipped), every
    path is checked to stay inside ``dest``. The tree is built next to its target and
    renamed into place; an existing ``dest/vllm`` is an error unless ``replace``.
    Returns ``dest/vllm``.
    """
    _check_archive(archive)
    dest = Path(dest)
    target = dest / PROJECT
    if target.exists() and not replace:
        raise SdistError(f"{target} already exists (use replace=True / --replace)")
    dest.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=dest, prefix=".vllm-extract-"))
    root = staging.resolve()
    count = 0
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                rel = package_relpath(member.name)
                if rel is None or not (member.isfile() or member.isdir()):
                    continue
                path = (staging / rel).resolve()
                if root not in path.parents:
                    raise SdistError(f"{archive}: member {member.name!r} escapes the target")
                if member.isdir():
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                if src is None:  # pragma: no cover
                    continue
                with src, open(path, "wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
                os.chmod(path, 0o755 if member.mode & 0o111 else 0o644)
                count += 1
        if not (staging / PROJECT / "__init__.py").is_file():
            raise SdistError(f"{archive}: no {PROJECT}/__init__.py in the archive")
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging / PROJECT, target)
    except (tarfile.TarError, EOFError) as exc:
        raise SdistError(f"{archive}: unreadable archive: {exc}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# --------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="download (or find cached) and print its path")
    p_fetch.add_argument("version")
    p_extract = sub.add_parser("extract", help="extract the vllm/ package tree into DEST")
    p_extract.add_argument("version")
    p_extract.add_argument("dest", type=Path)
    p_extract.add_argument("--replace", action="store_true", help="replace DEST/vllm")
    for p in (p_fetch, p_extract):
        p.add_argument("--cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        archive = fetch_sdist(args.version, args.cache_dir)
        if args.command == "fetch":
            print(archive)
        else:
            extract_package(archive, args.dest, replace=args.replace)
            print(args.dest)
    except SdistError as exc:
        print(f"vllm_sdist: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"vllm_sdist: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
