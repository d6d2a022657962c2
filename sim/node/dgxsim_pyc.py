"""The simulated node's Python keeps the bytecode of the code Ansible sends it.

Every module Ansible runs arrives as a zip of its code and the module_utils it needs, and
Python's zipimport compiles every source file in it again: about 0.1 s of the 0.27 s that a
`command` task costs a node on the sim's two cores, 100 modules compiled for each task. A
Spark has cores to spare; the sim, two nodes and the controller on two cores, does not.

install() makes zipimport look the compiled code up by the SHA-256 of the source first, in a
directory only root writes (the cache stays cold for tasks that do not become root). Code
read from the cache is renamed to the file it was compiled for now, so a traceback still
names the module's own path. Anything wrong with the cache (unreadable, torn, another
Python's) compiles the source as zipimport would have. Only the sim's node image installs it
(sim/node/Dockerfile); no task and no module of the collection depends on it.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
import zipimport

CodeType = type(compile("", "<empty>", "exec"))


def renamed(code: CodeType, filename: str) -> CodeType:
    """``code`` and the code objects in it, with ``filename`` as their file."""
    consts = tuple(renamed(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def entry(cache_dir: str, source: bytes) -> str:
    """The cache file for ``source``, for this Python's bytecode."""
    digest = hashlib.sha256(source).hexdigest()
    return os.path.join(cache_dir, f"{digest}.{sys.implementation.cache_tag}")


def cached_compiler(cache_dir: str, compile_source):
    """A zipimport ``_compile_source(pathname, source)`` that keeps ``compile_source``'s code in
    ``cache_dir``."""

    def compile_cached(pathname: str, source: bytes) -> CodeType:
        path = entry(cache_dir, source)
        try:
            with open(path, "rb") as f:
                code = marshal.load(f)
            if isinstance(code, CodeType):
                return renamed(code, pathname)
        except (OSError, EOFError, ValueError, TypeError):
            pass
        code = compile_source(pathname, source)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                marshal.dump(code, f)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return code

    compile_cached.uncached = compile_source
    return compile_cached


def install(cache_dir: str) -> None:
    """Cache what zipimport compiles in ``cache_dir`` (once per interpreter)."""
    current = zipimport._compile_source
    if not hasattr(current, "uncached"):
        zipimport._compile_source = cached_compiler(cache_dir, current)
