"""Keeps the Python code Jinja compiles each template string to, from one run to the next.

ansible-core 2.19 compiles a template string every time it renders one (its engine keeps no
compiled templates), and each task's worker is a fresh fork, so the same strings of the roles'
defaults and tasks are parsed, turned into Python and compiled again for every task on every
host: py-spy put a tenth of a full deploy.yml run's controller samples there. This callback
wraps the Jinja environment's ``compile`` for template strings: the code object is kept in the
checkout's ``.cache/jinja-code``, named by the SHA-256 of the environment's settings that shape
the generated code and of the source, under a directory for this Python, ansible-core and Jinja.
A string seen before is read back instead of compiled; anything wrong with a kept file (torn,
unreadable) compiles the source as Jinja would have. Template errors are raised by the compile
itself, so a string that does not compile is never kept.

Loaded by the checkout's ansible.cfg (``callback_plugins``) alone, as module_zip_cache is: the
collection does not ship it, and without it every run compiles its templates as ansible-core
does by default.
"""

from __future__ import annotations

import contextlib
import hashlib
import marshal
import os
import sys
import types
from pathlib import Path

import jinja2
from ansible.plugins.callback import CallbackBase
from ansible.release import __version__ as core_version

DOCUMENTATION = """
name: jinja_code_cache
type: aggregate
short_description: keep the Python code of compiled template strings from one run to the next
description:
  - Wraps the Jinja environment's compile for template strings, keeping each code object under
    the checkout's .cache/jinja-code by the digest of the environment's settings and the source.
"""

ROOT = Path(__file__).resolve().parents[2]
VERSIONS = f"{sys.implementation.cache_tag}-{core_version}-{jinja2.__version__}"
KEEP = ROOT / ".cache" / "jinja-code" / VERSIONS

# What the code generator reads from the environment when it writes a template's Python.
SETTINGS = (
    "block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
    "comment_start_string", "comment_end_string", "line_statement_prefix",
    "line_comment_prefix", "trim_blocks", "lstrip_blocks", "newline_sequence",
    "keep_trailing_newline", "optimized", "is_async", "autoescape",
)  # fmt: skip


def code_key(environment, source: str) -> str:
    """The kept file's name: the environment's code-shaping settings and the source."""
    finalize = getattr(environment, "finalize", None)
    settings = [repr(getattr(environment, name, None)) for name in SETTINGS]
    settings += [
        repr(sorted(getattr(environment, "extensions", {}))),
        type(environment).__qualname__,
        getattr(environment, "code_generator_class", type(None)).__qualname__,
        repr(finalize is None),
        repr(getattr(finalize, "jinja_pass_arg", None)),
    ]
    digest = hashlib.sha256("\0".join(settings).encode())
    digest.update(b"\0\0")
    digest.update(source.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def kept_compile(compile_code, keep: Path):
    """An ``Environment.compile`` that keeps what ``compile_code`` returns for a template
    string under ``keep``. Anything but a plain string compile goes to ``compile_code``."""

    def compile(self, source, name=None, filename=None, raw=False, defer_init=False):  # noqa: A001
        plain = (
            isinstance(source, str)
            and name is None
            and filename is None
            and not raw
            and not defer_init
            and not getattr(self, "_debuggable_template_source", False)
        )
        if not plain:
            return compile_code(self, source, name, filename, raw, defer_init)
        path = keep / code_key(self, source)
        with contextlib.suppress(OSError, EOFError, ValueError, TypeError):
            code = marshal.loads(path.read_bytes())
            if isinstance(code, types.CodeType):
                return code
        code = compile_code(self, source, name, filename, raw, defer_init)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        try:
            keep.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(marshal.dumps(code))
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
        return code

    compile.uncached = compile_code
    return compile


def install(environment_class=jinja2.Environment, keep: Path = KEEP) -> None:
    """Wrap ``environment_class.compile`` (once per process)."""
    current = environment_class.compile
    if not hasattr(current, "uncached"):
        environment_class.compile = kept_compile(current, keep)


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "jinja_code_cache"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        install()
