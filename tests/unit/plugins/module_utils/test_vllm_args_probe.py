"""Tests for plugins/module_utils/vllm_args_probe.py.

The probe script runs here under the test's own Python against fake ``vllm`` trees shaped
like the two layouts vLLM has had: before 0.14 (tool parsers in
``vllm.entrypoints.openai.tool_parsers``, registries only as dicts, reasoning parsers as
argparse choices) and from 0.14 (``vllm.tool_parsers``, ``list_registered()`` with lazily
registered names). The published source archives then show that every release from 0.10.0
to 0.33.0 has what the probe reaches for.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_args_probe import (
    ARGS_PROBE_SOURCE,
    EXTRA_SETTING,
    args_probe_entrypoint,
    args_probe_request,
    flag_value,
    judge,
    read_only,
    refusal_message,
    refused_flags,
    setting_for_flag,
    trim,
)
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_image_probe import (
    parse_probe_output,
)

SPEC = "vllm_serve_speculative_config"
MODEL = "/var/lib/dgx-spark/models/tiny-qwen3-moe"
GOOD = [MODEL, "--tensor-parallel-size", "2", "--distributed-executor-backend", "ray",
        "--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
        "--tool-call-parser", "qwen3_coder"]  # fmt: skip

# A vLLM CLI reduced to what the probe touches; {CLI_ARGS} is where make_arg_parser lives.
SERVE = """
import argparse
from vllm.entrypoints.{cli_args} import make_arg_parser, validate_parsed_serve_args


class FlexibleArgumentParser(argparse.ArgumentParser):
    pass


class ServeSubcommand:
    name = "serve"

    @staticmethod
    def cmd(args):
        raise AssertionError("the probe must never start a server")

    def validate(self, args):
        validate_parsed_serve_args(args)

    def subparser_init(self, subparsers):
        return make_arg_parser(subparsers.add_parser("serve", usage="vllm serve [model_tag]"))


def cmd_init():
    return [ServeSubcommand()]
"""
CLI_ARGS = """
import json
{reasoning_import}


def make_arg_parser(parser):
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("-tp", "--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--distributed-executor-backend")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--max-model-len", type=int)
    parser.add_argument("--speculative-config", type=json.loads)
    parser.add_argument("--reasoning-parser"{reasoning_choices})
    parser.add_argument("--enable-auto-tool-choice", action="store_true")
    parser.add_argument("--tool-call-parser")
    parser.add_argument("--tool-parser-plugin", default="")
    return parser


def validate_parsed_serve_args(args):
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise TypeError("Error: --enable-auto-tool-choice requires --tool-call-parser")
"""
ENGINE = """
class AsyncEngineArgs:
    @classmethod
    def from_cli_args(cls, args):
        spec = args.speculative_config or {}
        if spec and spec.get("method") not in ("mtp", "ngram"):
            raise ValueError(
                f"1 validation error for SpeculativeConfig: method {spec.get('method')!r} "
                "is not supported"
            )
        if spec.get("num_speculative_tokens") == 0:
            raise ValueError("num_speculative_tokens must be at least 1")
        made = cls()
        made.model, made.max_model_len = args.model, args.max_model_len
        return made

    # The stand-in's model configuration: the model's own length limit and a registry of one.
    def create_model_config(self):
        import json, os, types
        with open(os.path.join(self.model, "config.json")) as handle:
            config = json.load(handle)
        limit = config["max_position_embeddings"]
        if self.max_model_len and self.max_model_len > limit:
            raise ValueError(f"User-specified max_model_len ({self.max_model_len}) is greater "
                             f"than the derived max_model_len ({limit})")
        from vllm.model_executor.models.registry import inspect_model_cls
        inspect_model_cls(config["architectures"])
        if config["architectures"] != ["Qwen3MoeForCausalLM"]:
            raise ValueError(f"Model architectures {config['architectures']} are not supported "
                             "for now")
        return types.SimpleNamespace(max_model_len=self.max_model_len or limit,
                                     architectures=config["architectures"])
"""
# vLLM's registry inspects a model's class through a second Python; the probe runs it in its
# own process instead (this stand-in's second Python is a failure).
REGISTRY = """
def _run_in_subprocess(fn):
    raise RuntimeError("the model's class was inspected in a second Python")


def inspect_model_cls(architectures):
    return _run_in_subprocess(lambda: architectures)
"""
OLD_MANAGER = """
class {cls}:
    {attr} = {{"qwen3": object, "deepseek_r1": object, "hermes": object, "qwen3_coder": object}}

    @classmethod
    def import_{kind}_parser(cls, path):
        namespace = {{}}
        exec(open(path).read(), namespace)
        cls.{attr}.update(namespace["REGISTER"])
"""
NEW_MANAGER = """
class {cls}:
    {attr} = {{"hf": object}}
    lazy_parsers = {{"qwen3": ("m", "C"), "deepseek_r1": ("m", "C"), "qwen3_coder": ("m", "C")}}

    @classmethod
    def list_registered(cls):
        return sorted(set(cls.{attr}) | set(cls.lazy_parsers))

    @classmethod
    def import_{kind}_parser(cls, path):
        namespace = {{}}
        exec(open(path).read(), namespace)
        cls.{attr}.update(namespace["REGISTER"])
"""


def write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def make_vllm(root: Path, layout: str, version: str = "0.32.0", broken_tools: bool = False) -> Path:
    """A site directory with a fake ``vllm`` of the ``old`` (< 0.14) or ``new`` layout."""
    site = root / layout
    pkg = site / "vllm"
    for part in ("", "entrypoints", "entrypoints/cli", "engine", "entrypoints/openai"):
        write(pkg / part / "__init__.py")
    write(site / f"vllm-{version}.dist-info" / "METADATA", f"Name: vllm\nVersion: {version}\n")
    write(pkg / "engine" / "arg_utils.py", ENGINE)
    write(pkg / "model_executor" / "__init__.py")
    write(pkg / "model_executor" / "models" / "__init__.py")
    write(pkg / "model_executor" / "models" / "registry.py", REGISTRY)
    manager = OLD_MANAGER if layout == "old" else NEW_MANAGER
    write(pkg / "reasoning" / "__init__.py", manager.format(
        cls="ReasoningParserManager", attr="reasoning_parsers", kind="reasoning"))  # fmt: skip
    tools = manager.format(cls="ToolParserManager", attr="tool_parsers", kind="tool")
    if broken_tools:
        tools = "import vllm._C  # the compiled extension is missing\n" + tools
    if layout == "old":
        write(pkg / "entrypoints" / "openai" / "tool_parsers" / "__init__.py", tools)
        cli_args = "openai.cli_args"
        # Before 0.14 argparse itself refuses an unknown reasoning parser.
        reasoning_import = "from vllm.reasoning import ReasoningParserManager"
        choices = ", choices=list(ReasoningParserManager.reasoning_parsers)"
    else:
        write(pkg / "tool_parsers" / "__init__.py", tools)
        write(pkg / "entrypoints" / "launchers" / "__init__.py")
        cli_args, reasoning_import, choices = "launchers.cli_args", "", ""
    write(pkg / "entrypoints" / "cli" / "serve.py", SERVE.format(cli_args=cli_args))
    cli_text = CLI_ARGS.format(reasoning_import=reasoning_import, reasoning_choices=choices)
    write(pkg / "entrypoints" / Path(*cli_args.split(".")).with_suffix(".py"), cli_text)
    return site


def probe(site: Path, args: list, model_config: bool = False) -> dict:
    entry = args_probe_entrypoint(sys.executable)
    proc = subprocess.run(
        [sys.executable, "-S", *entry[1:], args_probe_request(args, model_config)],
        env={"PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    return parse_probe_output(proc.stdout, proc.stderr, proc.returncode)


@pytest.fixture(params=["old", "new"])
def site(request, tmp_path):
    return make_vllm(tmp_path, request.param)


# --------------------------------------------------------------------------- the probe


def test_probe_accepts_the_recipe(site):
    doc = probe(site, GOOD)
    assert doc["errors"] == {}, doc
    assert doc["vllm"] == "0.32.0"
    assert judge(doc, GOOD) == []
    assert set(doc["timings"]) >= {"import", "parse", "validate", "registries", "engine_args"}


def test_probe_reads_each_layouts_registry(tmp_path):
    old = probe(make_vllm(tmp_path, "old"), [MODEL])["registries"]
    new = probe(make_vllm(tmp_path, "new"), [MODEL])["registries"]
    assert old["tool"]["source"] == (
        "vllm.entrypoints.openai.tool_parsers.ToolParserManager.tool_parsers"
    )
    assert old["reasoning"]["source"] == "vllm.reasoning.ReasoningParserManager.reasoning_parsers"
    assert new["tool"]["source"] == "vllm.tool_parsers.ToolParserManager.list_registered()"
    # Lazily registered names count: list_registered() holds both kinds.
    assert new["reasoning"]["names"] == ["deepseek_r1", "hf", "qwen3", "qwen3_coder"]
    assert "qwen3_coder" in old["tool"]["names"]


@pytest.mark.parametrize(
    ("change", "setting", "flag", "words"),
    [
        (["--seed", "abc"], EXTRA_SETTING, "--seed", "invalid int value: 'abc'"),
        (["--no-such-flag"], EXTRA_SETTING, "--no-such-flag", "unrecognized arguments"),
        (["--speculative-config", "{"], SPEC, "--speculative-config", "invalid loads"),
        (["--speculative-config", '{"method": "eagle9"}'], SPEC,
         "--speculative-config", "SpeculativeConfig: method 'eagle9' is not supported"),
        (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 0}'], None,
         None, "num_speculative_tokens must be at least 1"),
    ],
)  # fmt: skip
def test_probe_quotes_what_vllm_refuses(site, change, setting, flag, words):
    args = GOOD + change
    problems = judge(probe(site, args), args)
    assert [(p["setting"], p["flag"]) for p in problems] == [(setting, flag)], problems
    assert words in problems[0]["message"]
    assert "usage:" not in problems[0]["message"]


def test_unknown_reasoning_parser_in_either_layout(tmp_path):
    args = [MODEL, "--reasoning-parser", "qwen9"]
    old = judge(probe(make_vllm(tmp_path, "old"), args), args)
    new = judge(probe(make_vllm(tmp_path, "new"), args), args)
    # Before 0.14 argparse refuses it itself; the registry check does not repeat it.
    assert [(p["setting"], p["stage"]) for p in old] == [("vllm_serve_reasoning_parser", "parse")]
    assert "invalid choice: 'qwen9'" in old[0]["message"]
    assert [(p["setting"], p["stage"]) for p in new] == [
        ("vllm_serve_reasoning_parser", "registry")
    ]
    assert new[0]["message"] == (
        "vLLM 0.32.0 has no reasoning parser 'qwen9'; it knows: deepseek_r1, hf, qwen3, qwen3_coder"
    )


def test_unknown_tool_call_parser(site):
    args = [MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "qwen9_coder"]
    problems = judge(probe(site, args), args)
    assert [(p["setting"], p["flag"]) for p in problems] == [
        ("vllm_serve_tool_call_parser", "--tool-call-parser")
    ]
    assert "no tool-call parser 'qwen9_coder'" in problems[0]["message"]


def test_auto_tool_choice_without_parser_names_both(site):
    args = [MODEL, "--enable-auto-tool-choice"]
    problems = judge(probe(site, args), args)
    assert [(p["stage"], p["setting"]) for p in problems] == [
        ("validate", "vllm_serve_enable_auto_tool_choice")
    ]
    assert "requires --tool-call-parser" in problems[0]["message"]


def test_a_plugin_registers_a_tool_parser(site, tmp_path):
    plugin = tmp_path / "my_parser.py"
    plugin.write_text("REGISTER = {'mine': object}\n")
    args = [MODEL, "--tool-parser-plugin", str(plugin), "--tool-call-parser", "mine"]
    doc = probe(site, args)
    assert "mine" in doc["registries"]["tool"]["names"]
    assert judge(doc, args) == []


def test_a_missing_plugin_is_refused(site):
    args = [MODEL, "--tool-parser-plugin", "/nowhere/plugin.py"]
    problems = judge(probe(site, args), args)
    assert [(p["stage"], p["setting"], p["flag"]) for p in problems] == [
        ("plugins", EXTRA_SETTING, "--tool-parser-plugin")
    ]
    assert "/nowhere/plugin.py" in problems[0]["message"]


def test_an_unreadable_registry_is_said_not_passed(tmp_path):
    site = make_vllm(tmp_path, "new", broken_tools=True)
    args = [MODEL, "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]
    doc = probe(site, args)
    assert doc["registries"]["tool"]["names"] is None
    assert "vllm._C" in doc["registries"]["tool"]["error"]
    problems = judge(doc, args)
    assert [p["setting"] for p in problems] == ["vllm_serve_tool_call_parser"]
    assert problems[0]["message"].startswith(
        "cannot tell whether vLLM 0.32.0 knows the tool-call parser 'qwen3_coder'"
    )
    # Without a tool-call parser to check, the broken registry refuses nothing.
    assert judge(doc, [MODEL]) == []


def test_an_image_without_vllm_cli(tmp_path):
    site = tmp_path / "empty"
    write(site / "vllm" / "__init__.py")
    doc = probe(site, GOOD)
    assert list(doc["errors"]) == ["import"]
    problems = judge(doc, GOOD)
    assert [(p["setting"], p["stage"]) for p in problems] == [("vllm_serve_image", "import")]
    assert "cannot import vllm.entrypoints.cli.serve" in problems[0]["message"]


def test_the_probe_never_runs_the_server(site):
    # ServeSubcommand.cmd raises: a probe that reached it would report an error.
    assert probe(site, GOOD)["errors"] == {}


# --------------------------------------------------------------------------- pure functions


def test_request_and_entrypoint():
    assert json.loads(args_probe_request([MODEL, "-tp", 2])) == {"args": [MODEL, "-tp", "2"]}
    assert json.loads(args_probe_request([MODEL], True)) == {"args": [MODEL], "model_config": True}
    assert args_probe_entrypoint("python3") == ["python3", "-c", ARGS_PROBE_SOURCE]
    with pytest.raises(ValueError):
        args_probe_request("--port 8000")


@pytest.mark.parametrize(
    ("args", "flag", "value"),
    [
        (GOOD, "--reasoning-parser", "qwen3"),
        ([MODEL, "--tool-call-parser=hermes"], "--tool-call-parser", "hermes"),
        ([MODEL, "--tool-call-parser", "a", "--tool-call-parser", "b"], "--tool-call-parser", "b"),
        ([MODEL, "--reasoning-parser"], "--reasoning-parser", None),
        ([MODEL], "--reasoning-parser", None),
    ],
)
def test_flag_value(args, flag, value):
    assert flag_value(args, flag) == value


@pytest.mark.parametrize(
    ("flag", "setting"),
    [
        ("--tensor-parallel-size", "vllm_serve_tensor_parallel_size"),
        ("-tp", "vllm_serve_tensor_parallel_size"),
        ("--reasoning-parser", "vllm_serve_reasoning_parser"),
        ("--reasoning_parser", "vllm_serve_reasoning_parser"),
        ("--nnodes", "vllm_serve_backend"),
        ("--master-addr", "spark_fast_ip"),
        ("--seed", EXTRA_SETTING),
        ("model_tag", "vllm_serve_model_path"),
    ],
)
def test_setting_for_flag(flag, setting):
    assert setting_for_flag(flag) == setting


@pytest.mark.parametrize(
    ("message", "args", "flags"),
    [
        # argparse as vLLM 0.32.0 words it
        ("usage: vllm serve [model_tag] [options]\nvllm serve: error: argument "
         "-tp/--tensor-parallel-size: invalid int value: 'two'", [MODEL, "-tp", "two"], ["-tp"]),
        ("vllm serve: error: argument -tp/--tensor-parallel-size: invalid int value: 'x'",
         [MODEL, "--tensor-parallel-size", "x"], ["--tensor-parallel-size"]),
        ("vllm serve: error: unrecognized arguments: --frobnicate 3",
         [MODEL, "--frobnicate", "3"], ["--frobnicate"]),
        ("TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser",
         [MODEL, "--enable-auto-tool-choice"], ["--enable-auto-tool-choice"]),
        ("ValueError: --grpc-port requires VLLM_USE_RUST_FRONTEND=1 vllm serve", [MODEL],
         ["--grpc-port"]),
        ("KeyError: nothing named here", [MODEL], []),
    ],
)  # fmt: skip
def test_refused_flags(message, args, flags):
    assert refused_flags(message, args) == flags


def test_trim():
    assert trim("usage: vllm serve\n  [a]\nvllm serve: error: argument --x: bad") == (
        "argument --x: bad"
    )
    long = trim("word " * 200)
    assert len(long) == 400 and long.endswith("...")


def test_read_only():
    assert read_only(["/m:/m", "/c:/c:rw", "/d:/d:ro", "/e:/e:rw,z"]) == [
        "/m:/m:ro", "/c:/c:ro", "/d:/d:ro", "/e:/e:ro,z",
    ]  # fmt: skip
    with pytest.raises(ValueError):
        read_only(["/only-one"])


def test_refusal_message():
    problems = [
        {"setting": EXTRA_SETTING, "flag": "--seed", "stage": "parse",
         "message": "argument --seed: invalid int value: 'abc'"},
        {"setting": "vllm_serve_reasoning_parser", "flag": "--reasoning-parser",
         "stage": "registry", "message": "vLLM 0.32.0+cpu has no reasoning parser 'x'"},
    ]  # fmt: skip
    assert refusal_message(problems, "dgx-spark/vllm-serving:current", "spark-1", "0.32.0+cpu") == (
        "spark-1: vLLM 0.32.0+cpu in dgx-spark/vllm-serving:current refuses the serving "
        "configuration; no container was touched and the running endpoint serves as before: "
        "vllm_serve_extra_args (--seed): argument --seed: invalid int value: "
        "'abc'; vllm_serve_reasoning_parser (--reasoning-parser): vLLM 0.32.0+cpu has no "
        "reasoning parser 'x'"
    )


# --------------------------------------------------------------------------- vLLM's releases


VERSIONS = ["0.10.0", "0.10.1", "0.11.0", "0.14.1", "0.17.0", "0.18.0", "0.19.0", "0.22.0",
            "0.28.0", "0.32.0", "0.33.0"]  # fmt: skip


def _member(archive: tarfile.TarFile, version: str, relpath: str) -> str | None:
    try:
        handle = archive.extractfile(f"vllm-{version}/{relpath}")
    except KeyError:
        return None
    return handle.read().decode() if handle else None


@pytest.mark.network
@pytest.mark.parametrize("version", VERSIONS)
def test_every_release_has_what_the_probe_reaches_for(version, fetch_vllm_sdist):
    with tarfile.open(fetch_vllm_sdist(version)) as archive:
        serve = _member(archive, version, "vllm/entrypoints/cli/serve.py")
        assert serve is not None
        # The CLI's own way to its parser: cmd_init, the serve command and its parser class.
        for needle in ("def cmd_init(", "def subparser_init(", "def validate(",
                       "make_arg_parser(", "FlexibleArgumentParser", 'name = "serve"'):  # fmt: skip
            assert needle in serve.replace("'", '"'), (version, needle)
        reasoning = _member(archive, version, "vllm/reasoning/abs_reasoning_parsers.py")
        assert reasoning and "class ReasoningParserManager" in reasoning
        assert "reasoning_parsers:" in reasoning
        tool_paths = ["vllm/tool_parsers/abstract_tool_parser.py",
                      "vllm/entrypoints/openai/tool_parsers/abstract_tool_parser.py"]  # fmt: skip
        found = [p for p in tool_paths if _member(archive, version, p)]
        # The first candidate the probe tries that exists is the registry.
        tools = _member(archive, version, found[0])
        assert tools and "class ToolParserManager" in tools and "tool_parsers:" in tools
        has_lister = "def list_registered(" in reasoning
        assert has_lister == ("def list_registered(" in tools)
        assert has_lister == (version >= "0.14")
        assert "def import_reasoning_parser(" in reasoning
        assert "def import_tool_parser(" in tools
        arg_utils = _member(archive, version, "vllm/engine/arg_utils.py")
        assert re.search(r"class AsyncEngineArgs\(EngineArgs\)", arg_utils)
        assert "def from_cli_args(" in arg_utils
        # Replaced in the probe, so that the model's class is inspected in its own process.
        registry = _member(archive, version, "vllm/model_executor/models/registry.py")
        assert re.search(r"^def _run_in_subprocess\(fn", registry, re.MULTILINE), version
        assert "_run_in_subprocess(" in registry.split("def inspect_model_cls", 1)[1], version


# --------------------------------------------------------------------------- the model's config


def _model_dir(tmp_path: Path, architectures=("Qwen3MoeForCausalLM",)) -> str:
    model = tmp_path / "model"
    model.mkdir()
    config = {"architectures": list(architectures), "max_position_embeddings": 2048}
    (model / "config.json").write_text(json.dumps(config))
    return str(model)


def test_model_config_within_the_models_limit(tmp_path):
    model = _model_dir(tmp_path)
    args = [model, "--max-model-len", "2048"]
    doc = probe(make_vllm(tmp_path, "new"), args, model_config=True)
    assert doc["errors"] == {}, doc
    assert doc["model_config"]["max_model_len"] == 2048
    assert judge(doc, args) == []


def test_a_max_model_len_beyond_the_models_is_refused_naming_the_setting(tmp_path):
    args = [_model_dir(tmp_path), "--max-model-len", "100000"]
    doc = probe(make_vllm(tmp_path, "new"), args, model_config=True)
    (problem,) = judge(doc, args)
    assert problem == {
        "setting": "vllm_serve_max_model_len",
        "flag": "--max-model-len",
        "stage": "model_config",
        "message": "ValueError: User-specified max_model_len (100000) is greater than the "
        "derived max_model_len (2048)",
    }


def test_an_architecture_the_image_cannot_build_names_the_image(tmp_path):
    args = [_model_dir(tmp_path, ["Qwen9ForCausalLM"])]
    doc = probe(make_vllm(tmp_path, "new"), args, model_config=True)
    (problem,) = judge(doc, args)
    assert (problem["setting"], problem["stage"]) == ("vllm_serve_image", "model_config")
    assert "Qwen9ForCausalLM" in problem["message"]


def test_an_unreadable_config_names_the_model(tmp_path):
    model = Path(_model_dir(tmp_path))
    (model / "config.json").write_text("{not json")
    doc = probe(make_vllm(tmp_path, "new"), [str(model)], model_config=True)
    (problem,) = judge(doc, [str(model)])
    assert (problem["setting"], problem["stage"]) == ("vllm_serve_model_path", "model_config")


def test_model_config_is_skipped_without_the_model_mounted(tmp_path):
    doc = probe(make_vllm(tmp_path, "new"), [MODEL], model_config=True)
    assert doc["errors"] == {}
    assert doc["model_config"] == f"skipped: {MODEL} has no config.json in the probe"


def test_model_config_only_when_asked(tmp_path):
    doc = probe(make_vllm(tmp_path, "new"), [_model_dir(tmp_path)])
    assert "model_config" not in doc and "model_config" not in doc["timings"]
