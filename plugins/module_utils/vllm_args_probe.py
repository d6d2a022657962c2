# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Ask the vLLM inside a serving image whether it accepts a ``vllm serve`` command line.

The probe (``ARGS_PROBE_SOURCE``) runs with the image's own Python, as the registry probe of
``vllm_image_probe`` does, and prints one JSON document after the same marker. It builds the
parser of ``vllm serve`` the way vLLM's CLI does (``vllm.entrypoints.cli.serve``:
``cmd_init()``, ``subparser_init()`` on a ``FlexibleArgumentParser``, which calls vLLM's own
``make_arg_parser``, wherever a version keeps it) and parses ``["serve", *args]``; then runs
the CLI's ``validate()``, imports the parser plugins the arguments name, reads the registries
of reasoning and tool-call parsers, and builds ``AsyncEngineArgs.from_cli_args`` (the
sub-configurations), then, when asked, the model's configuration. Nothing loads weights or
touches a device; the model's class is inspected in the probe's own process, not in the
second Python vLLM starts for it (``_run_in_subprocess`` of its model registry, there so that
vLLM's own process never initializes CUDA): that Python imports vLLM again, about 7 s of the
probe's 15 on the simulated pair.

The registries have moved between releases: tool parsers live in ``vllm.tool_parsers`` from
0.14 (before, ``vllm.entrypoints.openai.tool_parsers``); both managers list their names with
``list_registered()`` from 0.14 (eager and lazily registered names), and before that only in
their ``tool_parsers`` / ``reasoning_parsers`` dicts. The probe says which one it read, or why
it could not.

Everything else here is pure: which setting of the vllm_serve role a refusal names, and the
message for the user.
"""

from __future__ import annotations

import json
import re

from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_command import MANAGED_FLAGS
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_image_probe import (
    PROBE_MARKER,
)

# The setting of the vllm_serve role that gives each argument: the flags the role manages,
# the model (vLLM's positional ``model_tag``), and everything else from the extra arguments.
MODEL_SETTING = "vllm_serve_model_path"
EXTRA_SETTING = "vllm_serve_extra_args"
REASONING_SETTING = "vllm_serve_reasoning_parser"
TOOL_SETTING = "vllm_serve_tool_call_parser"

STAGES = ("import", "parser", "parse", "validate", "plugins", "engine_args", "model_config")

# What a refusal of the model's configuration is about, when it names no flag: the model's
# own limits (a field of vLLM's ModelConfig), what the image's vLLM cannot build, or else
# the model directory itself (a config.json this transformers cannot read).
_MODEL_FIELDS = (
    (re.compile(r"max_model_len"), "--max-model-len"),
    (re.compile(r"max_num_batched_tokens"), "--max-num-batched-tokens"),
    (re.compile(r"\bdtype\b"), "--dtype"),
)
_IMAGE_LIMITS = re.compile(
    r"quantization|architectures? .*(?:not supported|are not supported|cannot be)"
    r"|not supported for now|Model architectures",
    re.IGNORECASE,
)

# What a message quotes of vLLM's own words, at most.
MESSAGE_LIMIT = 400

# Runs inside the image. sys.argv[1] is the JSON request {"args": [...]}.
_ARGS_PROBE_TEMPLATE = r"""
import contextlib
import importlib
import importlib.util
import io
import json
import os
import sys
import time

if sys.path and sys.path[0] == "":
    del sys.path[0]

MARKER = __MARKER__
REQUEST = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
START = time.monotonic()

# (registry, candidate modules, manager class, eager dict, lazy dict)
REGISTRIES = (
    ("reasoning", ("vllm.reasoning",), "ReasoningParserManager", "reasoning_parsers",
     "lazy_parsers"),
    ("tool", ("vllm.tool_parsers", "vllm.entrypoints.openai.tool_parsers"),
     "ToolParserManager", "tool_parsers", "lazy_parsers"),
)


def emit(doc):
    doc["seconds"] = round(time.monotonic() - START, 2)
    sys.stdout.write("\n" + MARKER + json.dumps(doc) + "\n")
    sys.stdout.flush()
    os._exit(0)


def describe(exc):
    text = "%s: %s" % (type(exc).__name__, exc)
    return text if len(text) <= 4000 else text[:3997] + "..."


def vllm_version():
    from importlib import metadata
    try:
        return metadata.version("vllm")
    except Exception:
        pass
    try:
        dist = (metadata.packages_distributions().get("vllm") or [None])[0]
        return metadata.version(dist) if dist else None
    except Exception:
        return None


doc = {
    "python": "%d.%d.%d" % sys.version_info[:3],
    "vllm": vllm_version(),
    "errors": {},
    "registries": {},
    "timings": {},
}


def timed(name, started):
    doc["timings"][name] = round(time.monotonic() - started, 2)


def find_manager(modules, cls_name):
    # The first candidate module that exists is the registry's; its import errors count.
    for name in modules:
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            spec = None
        if spec is None:
            continue
        return name, getattr(importlib.import_module(name), cls_name)
    raise LookupError("none of %s is in this vLLM" % ", ".join(modules))


def read_registry(modules, cls_name, eager, lazy):
    entry = {"names": None, "source": None, "error": None}
    try:
        module, manager = find_manager(modules, cls_name)
        lister = getattr(manager, "list_registered", None)
        if callable(lister):
            names = list(lister())
            entry["source"] = "%s.%s.list_registered()" % (module, cls_name)
        else:
            names = list(getattr(manager, eager))
            names += list(getattr(manager, lazy, None) or {})
            entry["source"] = "%s.%s.%s" % (module, cls_name, eager)
        entry["names"] = sorted(set(str(n) for n in names))
    except BaseException as exc:
        entry["error"] = describe(exc)
    return entry


started = time.monotonic()
try:
    serve_cli = importlib.import_module("vllm.entrypoints.cli.serve")
except BaseException as exc:
    doc["errors"]["import"] = describe(exc)
    emit(doc)
timed("import", started)

started = time.monotonic()
try:
    commands = [c for c in serve_cli.cmd_init() if getattr(c, "name", None) == "serve"]
    if not commands:
        raise LookupError("vllm.entrypoints.cli.serve.cmd_init() has no 'serve' command")
    command = commands[0]
    parser = serve_cli.FlexibleArgumentParser(prog="vllm", description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    command.subparser_init(subparsers).set_defaults(dispatch_function=command.cmd)
except BaseException as exc:
    doc["errors"]["parser"] = describe(exc)
    emit(doc)
timed("parser", started)

started = time.monotonic()
said = io.StringIO()
args = None
try:
    with contextlib.redirect_stderr(said), contextlib.redirect_stdout(said):
        args = parser.parse_args(["serve"] + [str(a) for a in REQUEST.get("args") or []])
except SystemExit as exc:
    doc["errors"]["parse"] = said.getvalue().strip() or "argparse exited with %s" % exc.code
except BaseException as exc:
    doc["errors"]["parse"] = describe(exc)
timed("parse", started)

if args is not None:
    if getattr(args, "model_tag", None) is not None:
        args.model = args.model_tag
    started = time.monotonic()
    try:
        command.validate(args)
    except BaseException as exc:
        doc["errors"]["validate"] = describe(exc)
    timed("validate", started)

    # Plugins register parsers at run time, before vLLM checks the names.
    started = time.monotonic()
    for attr, (_, modules, cls_name, _e, _l) in zip(
            ("reasoning_parser_plugin", "tool_parser_plugin"), REGISTRIES):
        plugin = getattr(args, attr, None)
        if not plugin or len(plugin) <= 3:
            continue
        try:
            manager = find_manager(modules, cls_name)[1]
            loader = getattr(manager, "import_" + attr.rsplit("_", 1)[0], None)
            if loader is None:
                raise LookupError("%s cannot import plugins in this vLLM" % cls_name)
            loader(plugin)
        except BaseException as exc:
            doc["errors"].setdefault(
                "plugins", "--%s %s: %s" % (attr.replace("_", "-"), plugin, describe(exc)))
    timed("plugins", started)

started = time.monotonic()
for name, modules, cls_name, eager, lazy in REGISTRIES:
    doc["registries"][name] = read_registry(modules, cls_name, eager, lazy)
timed("registries", started)

engine_args = None
if args is not None:
    started = time.monotonic()
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        engine_args = AsyncEngineArgs.from_cli_args(args)
    except BaseException as exc:
        doc["errors"]["engine_args"] = describe(exc)
    timed("engine_args", started)

# The model's configuration as the engine builds it first, from config.json and the
# tokenizer's files (no weights, no device): the model's own length limit, its architecture
# in this vLLM's registry, its quantization, a config this transformers cannot read.
if engine_args is not None and REQUEST.get("model_config"):
    started = time.monotonic()
    model = str(getattr(engine_args, "model", "") or "")
    if not os.path.isfile(os.path.join(model, "config.json")):
        doc["model_config"] = "skipped: %s has no config.json in the probe" % model
    else:
        try:
            # vLLM inspects the model's class in a fresh Python (vLLM imported a second time:
            # seconds on a CPU) only so that its own process never initializes CUDA. This
            # process has no device and ends here: the class is inspected in it.
            try:
                registry = importlib.import_module("vllm.model_executor.models.registry")
            except ImportError:
                registry = None
            if callable(getattr(registry, "_run_in_subprocess", None)):
                registry._run_in_subprocess = lambda fn: fn()
            config = engine_args.create_model_config()
            doc["model_config"] = {
                "max_model_len": getattr(config, "max_model_len", None),
                "architectures": list(getattr(config, "architectures", None) or []),
                "quantization": getattr(config, "quantization", None),
                "dtype": str(getattr(config, "dtype", "")),
            }
        except BaseException as exc:
            doc["errors"]["model_config"] = describe(exc)
    timed("model_config", started)
emit(doc)
"""
ARGS_PROBE_SOURCE = _ARGS_PROBE_TEMPLATE.replace("__MARKER__", repr(PROBE_MARKER))


def args_probe_entrypoint(python: str) -> list[str]:
    return [python, "-c", ARGS_PROBE_SOURCE]


def args_probe_request(args: list, model_config: bool = False) -> str:
    """The JSON argument of ``ARGS_PROBE_SOURCE``: the arguments after ``vllm serve`` and
    whether to build the model's configuration from the model directory."""
    if not isinstance(args, (list, tuple)):
        raise ValueError("args must be a list")
    request = {"args": [str(a) for a in args]}
    if model_config:
        request["model_config"] = True
    return json.dumps(request)


def read_only(volumes: list) -> list[str]:
    """Docker bind specs (``host:container[:options]``) made read-only: the probe writes nothing."""
    out = []
    for volume in volumes:
        parts = str(volume).split(":")
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise ValueError(f"a volume must be host:container[:options], got {volume!r}")
        given = parts[2].split(",") if len(parts) > 2 else []
        options = [o for o in given if o not in ("rw", "ro", "")]
        out.append(":".join(parts[:2] + [",".join(["ro", *options])]))
    return out


# --------------------------------------------------------------------------- pure logic


def flag_value(args: list, flag: str) -> str | None:
    """The value ``args`` give ``flag`` (``--flag v`` or ``--flag=v``), the last one winning."""
    found = None
    for index, arg in enumerate(args):
        arg = str(arg)
        if arg == flag and index + 1 < len(args):
            found = str(args[index + 1])
        elif arg.startswith(flag + "="):
            found = arg[len(flag) + 1 :]
    return found


def setting_for_flag(flag: str) -> str:
    """The vllm_serve variable that gives ``flag`` (extra arguments give what the role does not)."""
    if flag == "model_tag":
        return MODEL_SETTING
    normal = flag.split("=", 1)[0]
    if normal.startswith("--"):
        normal = "--" + normal[2:].replace("_", "-")
    name = MANAGED_FLAGS.get(normal)
    return name.split(" ", 1)[0] if name else EXTRA_SETTING


_ARGUMENT_RE = re.compile(r"argument ((?:-{1,2}[\w.-]+|model_tag)(?:/-{1,2}[\w.-]+)*)")
_FLAG_RE = re.compile(r"(?<![\w-])(-{1,2}[A-Za-z][\w.-]*)")
_CONFIG_RE = re.compile(r"\b([A-Z][A-Za-z]*?)Config\b")


def refused_flags(message: str, args: list) -> list[str]:
    """The flags vLLM's message is about, as the arguments spell them, most specific first.

    argparse names one argument (``argument -tp/--tensor-parallel-size: ...``); "unrecognized
    arguments" lists them; vLLM's own checks name flags in their text.
    """
    given = {str(a).split("=", 1)[0] for a in args if str(a).startswith("-")}
    match = _ARGUMENT_RE.search(message)
    if match:
        names = match.group(1).split("/")
        chosen = [n for n in names if n in given] or names
        return chosen[:1]
    flags = []
    # pydantic names the configuration class (1 validation error for SpeculativeConfig).
    for name in _CONFIG_RE.findall(message):
        flag = "--" + re.sub(r"(?<!^)(?=[A-Z])", "-", name).lower() + "-config"
        if flag in given and flag not in flags:
            flags.append(flag)
    for flag in _FLAG_RE.findall(message):
        flag = flag.rstrip(".")
        if flag not in flags and (flag in given or flag.startswith("--")):
            flags.append(flag)
    # A flag the command line carries is what the user can change; others are vLLM's advice.
    return [f for f in flags if f in given] or flags


def trim(message: str, limit: int = MESSAGE_LIMIT) -> str:
    """vLLM's message on one line, the argparse usage dropped, at most ``limit`` characters."""
    text = message.strip()
    if ": error: " in text:
        text = text.split(": error: ", 1)[1]
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _problem(setting: str, flag: str | None, stage: str, message: str) -> dict:
    return {"setting": setting, "flag": flag, "stage": stage, "message": message}


def _parser_problem(
    kind: str, setting: str, flag: str, name: str | None, registry: dict | None, version: str
) -> dict | None:
    if not name:
        return None
    registry = registry or {}
    names = registry.get("names")
    if names is None:
        why = registry.get("error") or "the probe did not read it"
        return _problem(
            setting, flag, "registry",
            f"cannot tell whether vLLM {version} knows the {kind} parser {name!r}: its registry "
            f"of {kind} parsers cannot be read ({trim(why)})",
        )  # fmt: skip
    if name in names:
        return None
    return _problem(
        setting, flag, "registry",
        trim(f"vLLM {version} has no {kind} parser {name!r}; it knows: {', '.join(names)}", 1000),
    )  # fmt: skip


def _model_config_setting(message: str, args: list) -> tuple[str, str | None]:
    """(setting, flag) a refusal of the model's configuration is about."""
    given = {str(a).split("=", 1)[0] for a in args}
    for pattern, flag in _MODEL_FIELDS:
        if pattern.search(message) and flag in given:
            return setting_for_flag(flag), flag
    if _IMAGE_LIMITS.search(message):
        return "vllm_serve_image", None
    return MODEL_SETTING, None


def judge(doc: dict, args: list) -> list[dict]:
    """What the image's vLLM refuses in ``args``, each naming the vllm_serve setting.

    ``doc`` is the probe's document. Import and parser-building failures name no setting: the
    image cannot be asked, which is itself a refusal (nothing is passed silently).
    """
    errors = doc.get("errors") or {}
    version = doc.get("vllm") or "(version unknown)"
    problems: list[dict] = []
    for stage in ("import", "parser"):
        if errors.get(stage):
            what = "import vllm.entrypoints.cli.serve" if stage == "import" else "build its parser"
            problems.append(
                _problem(
                    "vllm_serve_image",
                    None,
                    stage,
                    f"vLLM {version} in the image cannot {what}: {trim(errors[stage])}",
                )  # fmt: skip
            )
            return problems
    for stage in ("parse", "validate", "plugins", "engine_args", "model_config"):
        message = errors.get(stage)
        if not message:
            continue
        flags = refused_flags(message, args)
        flag = flags[0] if flags else None
        # A message that names no argument is the whole command line's.
        setting = setting_for_flag(flag) if flag else None
        if stage == "model_config" and not flag:
            setting, flag = _model_config_setting(message, args)
        problems.append(_problem(setting, flag, stage, trim(message)))
    named = {p["setting"] for p in problems}
    registries = doc.get("registries") or {}
    checks = (
        ("reasoning", REASONING_SETTING, "--reasoning-parser"),
        ("tool", TOOL_SETTING, "--tool-call-parser"),
    )
    for kind, setting, flag in checks:
        if setting in named:  # vLLM itself already refused it (choices before 0.14)
            continue
        found = _parser_problem(
            "tool-call" if kind == "tool" else kind, setting, flag, flag_value(args, flag),
            registries.get(kind), version,
        )  # fmt: skip
        if found:
            problems.append(found)
    return problems


def refusal_message(problems: list[dict], image: str, node: str, version: str | None) -> str:
    """One message for fail_json: the image, the node, and each setting with vLLM's words."""
    parts = []
    for problem in problems:
        where = problem["setting"] or "the command line"
        if problem.get("flag"):
            where += f" ({problem['flag']})"
        parts.append(f"{where}: {problem['message']}")
    return (
        f"{node}: vLLM {version or '(version unknown)'} in {image} refuses the serving "
        f"configuration; no container was touched and the running endpoint serves as before: "
        + "; ".join(parts)
    )
