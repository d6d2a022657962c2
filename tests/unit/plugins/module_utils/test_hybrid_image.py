"""Tests for plugins/module_utils/hybrid_image.py.

Inputs are real where they can be: the ``Config`` of the simulated pair's fixture images as
``docker image inspect`` reports it, wheel file names from the Ray wheelhouse the sim
downloads, and (marked ``network``) the ``registry.py`` of published vLLM releases, read
from their source archives (fetched and cached by tools/vllm_sdist.py).
"""

from __future__ import annotations

import ast
import re
import tarfile
import textwrap

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import hybrid_image as hi
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_image_probe import (
    MODEL_DIRS,
    architecture_entries,
)
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_registry import (
    REGISTRY_FILE,
    parse_registry,
)

# `docker image inspect -f '{{json .Config}}'` of the sim's fixture images.
BASE_CONFIG = {
    "Env": [
        "PATH=/opt/ray/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "VIRTUAL_ENV=/opt/ray",
        "RAY_DEDUP_LOGS=0",
        "HF_HUB_OFFLINE=1",
    ],
    "Entrypoint": ["/usr/local/bin/cluster-entrypoint"],
    "Labels": {"dgx_spark.sim": "image", "dgx_spark.sim.inputs": "6ca7f75b35bebc30"},
}
DONOR_CONFIG = {
    "Env": [
        "PATH=/opt/vllm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "VIRTUAL_ENV=/opt/vllm",
        "VLLM_CPU_KVCACHE_SPACE=1",
        "HF_HUB_OFFLINE=1",
    ],
    "Entrypoint": ["vllm", "serve"],
    "Labels": {"dgx_spark.sim": "image", "dgx_spark.sim.inputs": "e4eefc8239691daa"},
}

# `ls` of the Ray 2.60.0 wheelhouse for CPython 3.11 on x86_64 (sim/sim_images.py downloads it).
RAY_WHEELHOUSE = [
    "attrs-26.1.0-py3-none-any.whl",
    "charset_normalizer-3.5.3-cp311-cp311-manylinux1_x86_64.manylinux_2_28_x86_64"
    ".manylinux_2_5_x86_64.whl",
    "msgpack-1.2.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64"
    ".manylinux_2_28_x86_64.whl",
    "protobuf-7.36.2-cp310-abi3-manylinux2014_x86_64.whl",
    "pyyaml-6.0.4-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
    "ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl",
    "rpds_py-2026.9.1-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
]

# The shape of vLLM 0.14's registry.py, cut down: category dicts merged into _VLLM_MODELS.
OLD_REGISTRY = textwrap.dedent(
    """\
    # SPDX-License-Identifier: GPL-3.0-or-later \N{EM DASH} a non-ASCII comment shifts byte offsets
    _TEXT_GENERATION_MODELS = {
        "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
        "Qwen3NextForCausalLM": ("qwen3_next", "Qwen3NextForCausalLM"),
    }

    _MULTIMODAL_MODELS = {
        "Qwen2VLForConditionalGeneration": ("qwen2_vl", "Qwen2VLForConditionalGeneration"),
    }

    _VLLM_MODELS = {
        **_TEXT_GENERATION_MODELS,
        **_MULTIMODAL_MODELS,
    }

    ModelRegistry = dict(_VLLM_MODELS)
    """
)
PKG = "vllm.model_executor.models"


# --------------------------------------------------------------------------- input_digest


def test_digest_is_twelve_hex_and_stable():
    inputs = {"base": "sha256:1", "donor": "sha256:2", "strategy": "overlay"}
    digest = hi.input_digest(inputs)
    assert re.fullmatch(r"[0-9a-f]{12}", digest)
    assert hi.input_digest(dict(reversed(list(inputs.items())))) == digest


@pytest.mark.parametrize(
    "change",
    [
        {"base": "sha256:other"},
        {"donor": "sha256:other"},
        {"strategy": "transplant"},
        {"dockerfile": "FROM x\n# one more line\n"},
        {"context": {"wheels": ["ray-2.61.0-cp311-cp311-manylinux2014_x86_64.whl"]}},
        {"architectures": ["Qwen3MoeForCausalLM", "Qwen3ForCausalLM"]},
    ],
)
def test_digest_changes_with_every_input(change):
    inputs = {
        "base": "sha256:1",
        "donor": "sha256:2",
        "strategy": "overlay",
        "dockerfile": "FROM x\n",
        "context": {"wheels": ["ray-2.60.0-cp311-cp311-manylinux2014_x86_64.whl"]},
        "architectures": ["Qwen3MoeForCausalLM"],
    }
    assert hi.input_digest({**inputs, **change}) != hi.input_digest(inputs)


def test_digest_refuses_what_is_not_plain_data():
    with pytest.raises(hi.HybridImageError, match="plain data"):
        hi.input_digest({"x": object()})


# --------------------------------------------------------------------------- environment


def test_parse_env_keeps_order_and_equals_signs_in_values():
    env = hi.parse_env(["B=1", "A=x=y", "EMPTY=", "broken"])
    assert list(env.items()) == [("B", "1"), ("A", "x=y"), ("EMPTY", "")]


def test_merge_env_of_the_fixture_images():
    merged = hi.merge_env(DONOR_CONFIG["Env"], BASE_CONFIG["Env"])
    # The base's Ray setting comes along; its virtualenv and PATH entry into it do not.
    assert merged["set"] == {"RAY_DEDUP_LOGS": "0"}
    assert merged["env"]["PATH"] == hi.parse_env(DONOR_CONFIG["Env"])["PATH"]
    assert merged["env"]["VIRTUAL_ENV"] == "/opt/vllm"
    assert merged["carried"] == ["RAY_DEDUP_LOGS"]
    assert merged["skipped"] == ["VIRTUAL_ENV"]
    assert merged["kept_donor"] == []
    assert merged["path_added"] == []


def test_merge_env_conflicts_path_and_overrides():
    donor = ["PATH=/usr/local/nvidia/bin:/usr/bin", "NCCL_DEBUG=WARN", "LD_LIBRARY_PATH=/d/lib"]
    base = [
        "PATH=/workspace/bin:/usr/bin:/opt/venv/bin",
        "VIRTUAL_ENV=/opt/venv",
        "NCCL_DEBUG=INFO",
        "LD_LIBRARY_PATH=/b/lib",
        "RAY_memory_monitor_refresh_ms=0",
    ]
    merged = hi.merge_env(donor, base, overrides={"NCCL_IB_DISABLE": 0, "NCCL_DEBUG": "TRACE"})
    assert merged["env"]["PATH"] == "/usr/local/nvidia/bin:/usr/bin:/workspace/bin"
    assert merged["path_added"] == ["/workspace/bin"]
    assert merged["kept_donor"] == ["NCCL_DEBUG"]
    assert sorted(merged["skipped"]) == ["LD_LIBRARY_PATH", "VIRTUAL_ENV"]
    assert merged["env"]["LD_LIBRARY_PATH"] == "/d/lib"
    assert merged["set"] == {
        "NCCL_DEBUG": "TRACE",
        "PATH": "/usr/local/nvidia/bin:/usr/bin:/workspace/bin",
        "RAY_memory_monitor_refresh_ms": "0",
        "NCCL_IB_DISABLE": "0",
    }


def test_merge_env_skip_list_is_the_callers():
    merged = hi.merge_env(["A=1"], ["LD_LIBRARY_PATH=/b/lib"], skip=[])
    assert merged["set"] == {"LD_LIBRARY_PATH": "/b/lib"}


def test_merge_env_refuses_a_bad_override_name():
    with pytest.raises(hi.HybridImageError, match="not valid"):
        hi.merge_env([], [], overrides={"NOT-VALID": "1"})


@pytest.mark.parametrize(
    ("env", "line"),
    [
        ({"RAY_DEDUP_LOGS": "0"}, 'ENV RAY_DEDUP_LOGS="0"'),
        ({"PATH": "/a:/b"}, 'ENV PATH="/a:/b"'),
        ({"X": "has space"}, 'ENV X="has space"'),
        ({"X": 'say "hi"'}, 'ENV X="say \\"hi\\""'),
        ({"X": "a\\b"}, 'ENV X="a\\\\b"'),
        # The builder would expand $HOME inside ENV: the value must stay literal.
        ({"X": "$HOME/x"}, 'ENV X="\\$HOME/x"'),
        ({"EMPTY": ""}, 'ENV EMPTY=""'),
    ],
)
def test_an_env_instruction_quotes_literally(env, line):
    assert hi.instruction("ENV", env) == line


def test_every_pair_is_one_instruction_continued_over_lines():
    labels = {"dgx_spark.cluster.hybrid_image.base": "vllm-node:1", "a/b-c_d": "$x", "n": 3}
    assert hi.instruction("LABEL", labels).split("\n") == [
        'LABEL dgx_spark.cluster.hybrid_image.base="vllm-node:1" \\',
        '    a/b-c_d="\\$x" \\',
        '    n="3"',
    ]
    assert hi.instruction("ENV", {}) == ""


@pytest.mark.parametrize(
    ("keyword", "pairs", "message"),
    [
        ("ENV", {"X": "two\nlines"}, "line break"),
        ("LABEL", {"x": "a\rb"}, "line break"),
        ("ENV", {"1X": "v"}, "environment variable name '1X' is not valid"),
        ("LABEL", {"has space": "v"}, "label name 'has space' is not valid"),
        ("LABEL", {"-x": "v"}, "label name '-x' is not valid"),
        ("RUN", {"X": "v"}, "must be ENV or LABEL, not 'RUN'"),
    ],
)
def test_an_instruction_refuses(keyword, pairs, message):
    with pytest.raises(hi.HybridImageError, match=re.escape(message)):
        hi.instruction(keyword, pairs)


# --------------------------------------------------------------------------- cluster files


@pytest.mark.parametrize(
    ("entrypoint", "base_venv", "expected"),
    [
        (BASE_CONFIG["Entrypoint"], "/opt/ray", ["/usr/local/bin/cluster-entrypoint"]),
        (DONOR_CONFIG["Entrypoint"], "", []),
        (["/opt/nvidia/nvidia_entrypoint.sh"], "", ["/opt/nvidia/nvidia_entrypoint.sh"]),
        (["/bin/bash", "/workspace/run-cluster-node.sh"], "", ["/workspace/run-cluster-node.sh"]),
        (["/bin/sh", "-c", "/usr/local/bin/start.sh --head"], "", []),
        (["/opt/ray/bin/ray", "start"], "/opt/ray", []),
        (["/usr/bin/tini", "--", "/entry.sh"], "", ["/entry.sh"]),
        ("/usr/local/bin/entry", "", ["/usr/local/bin/entry"]),
        (None, "", []),
    ],
)
def test_cluster_files_from_entrypoints(entrypoint, base_venv, expected):
    assert hi.cluster_files(entrypoint, [], base_venv) == expected


def test_cluster_files_add_extra_once():
    found = hi.cluster_files(
        ["/usr/local/bin/cluster-entrypoint"],
        ["/usr/local/bin/cluster-entrypoint", "/etc/cluster/", "/opt/scripts/ray-up.sh"],
    )
    assert found == ["/usr/local/bin/cluster-entrypoint", "/etc/cluster", "/opt/scripts/ray-up.sh"]


def test_cluster_files_refuse_a_relative_extra():
    with pytest.raises(hi.HybridImageError, match="hybrid_image_cluster_files"):
        hi.cluster_files([], ["scripts/start.sh"])


# --------------------------------------------------------------------------- wheels


def _wheel_platforms(filename: str) -> set[str]:
    return set(filename[: -len(".whl")].split("-")[-1].split("."))


def test_platforms_accept_every_binary_wheel_of_the_ray_wheelhouse():
    platforms = set(hi.wheel_platforms("x86_64", "2.36"))
    for wheel in RAY_WHEELHOUSE:
        tags = _wheel_platforms(wheel)
        assert tags == {"any"} or tags & platforms, wheel


def test_platforms_x86_64_newest_first_with_legacy_aliases():
    platforms = hi.wheel_platforms("x86_64", "2.36")
    assert platforms[0] == "manylinux_2_36_x86_64"
    assert platforms[-1] == "manylinux1_x86_64"
    for tag in ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux2010_x86_64"):
        assert tag in platforms
    # pip matches literally: the 2014 alias sits right after the glibc 2.17 tag.
    assert platforms.index("manylinux2014_x86_64") == platforms.index("manylinux_2_17_x86_64") + 1
    assert "manylinux_2_37_x86_64" not in platforms


def test_platforms_aarch64_start_at_2_17():
    platforms = hi.wheel_platforms("aarch64", "2.35")
    assert platforms[0] == "manylinux_2_35_aarch64"
    assert platforms[-2:] == ["manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert not [p for p in platforms if "2010" in p or "manylinux1" in p]


def test_platforms_name_machines_as_wheels_do():
    assert hi.wheel_platforms("arm64", "2.39")[0] == "manylinux_2_39_aarch64"
    assert hi.wheel_platforms("AMD64", "2.28")[0] == "manylinux_2_28_x86_64"


@pytest.mark.parametrize(
    ("machine", "glibc", "message"),
    [
        ("x86_64", "", "not glibc"),  # platform.libc_ver() on musl: ('', '')
        ("x86_64", "3.1", "unexpected glibc"),
        ("aarch64", "2.16", "older than any manylinux"),
    ],
)
def test_platforms_refuse(machine, glibc, message):
    with pytest.raises(hi.HybridImageError, match=message):
        hi.wheel_platforms(machine, glibc)


def test_wheel_target_for_the_donors_python():
    target = hi.wheel_target("3.11.2", "x86_64", "2.36", ["ray==2.60.0", "pip"])
    assert target["python_version"] == "3.11"
    assert target["abi"] == "cp311"
    assert target["implementation"] == "cp"
    assert target["requirements"] == ["ray==2.60.0", "pip"]
    assert re.fullmatch(r"ray-2\.60\.0-cp311-x86_64-[0-9a-f]{8}", target["key"])
    other = hi.wheel_target("3.12.3", "aarch64", "2.35", ["ray[cgraph]==2.60.0", "pip"])
    assert other["abi"] == "cp312"
    assert other["key"].startswith("ray-cgraph-2.60.0-cp312-aarch64-")
    assert other["key"] != target["key"]


@pytest.mark.parametrize(
    ("python", "requirements", "message"),
    [("python3", ["ray==2.60.0"], "Python version"), ("3.11.2", [], "no requirements")],
)
def test_wheel_target_refuses(python, requirements, message):
    with pytest.raises(hi.HybridImageError, match=message):
        hi.wheel_target(python, "x86_64", "2.36", requirements)


# --------------------------------------------------------------------------- transplant


def _entry(module: str, cls: str, file: str, present: bool | None = True) -> dict:
    return {"module": module, "class": cls, "file": file, "file_present": present}


DONOR_ARCHS = {
    "Qwen3MoeForCausalLM": _entry(
        f"{PKG}.qwen3_moe", "Qwen3MoeForCausalLM", "vllm/model_executor/models/qwen3_moe.py"
    ),
    "Qwen3_5MoeForConditionalGeneration": _entry(
        f"{PKG}.qwen3_5",
        "Qwen3_5MoeForConditionalGeneration",
        "vllm/model_executor/models/qwen3_5.py",
    ),
    "Qwen3_5ForConditionalGeneration": _entry(
        f"{PKG}.qwen3_5", "Qwen3_5ForConditionalGeneration", "vllm/model_executor/models/qwen3_5.py"
    ),
    "NewPackagedModel": _entry(
        "vllm.models.newpkg", "NewPackagedModel", "vllm/models/newpkg/__init__.py"
    ),
    "Ghost": _entry(f"{PKG}.ghost", "Ghost", "vllm/model_executor/models/ghost.py", False),
}
BASE_ARCHS = {
    "Qwen3MoeForCausalLM": DONOR_ARCHS["Qwen3MoeForCausalLM"],
}


def test_transplant_plan_for_qwen3_5():
    plan = hi.transplant_plan(
        ["Qwen3_5MoeForConditionalGeneration", "Qwen3_5ForConditionalGeneration"],
        DONOR_ARCHS,
        BASE_ARCHS,
    )
    assert plan["files"] == ["vllm/model_executor/models/qwen3_5.py"]
    assert plan["entries"] == {
        "Qwen3_5MoeForConditionalGeneration": [
            f"{PKG}.qwen3_5",
            "Qwen3_5MoeForConditionalGeneration",
        ],
        "Qwen3_5ForConditionalGeneration": [f"{PKG}.qwen3_5", "Qwen3_5ForConditionalGeneration"],
    }
    assert plan["already_registered"] == []


def test_transplant_plan_copies_the_donors_file_of_a_registered_architecture():
    plan = hi.transplant_plan(["Qwen3MoeForCausalLM"], DONOR_ARCHS, BASE_ARCHS)
    assert plan == {
        "files": ["vllm/model_executor/models/qwen3_moe.py"],
        "entries": {},
        "already_registered": ["Qwen3MoeForCausalLM"],
    }


def test_transplant_plan_takes_a_package_whole():
    plan = hi.transplant_plan(["NewPackagedModel"], DONOR_ARCHS, {})
    assert plan["files"] == ["vllm/models/newpkg"]


def test_transplant_plan_re_registers_an_architecture_the_base_maps_elsewhere():
    base = {"Qwen3MoeForCausalLM": _entry(f"{PKG}.qwen3_moe_old", "Qwen3MoeForCausalLM", "x.py")}
    plan = hi.transplant_plan(["Qwen3MoeForCausalLM"], DONOR_ARCHS, base)
    assert plan["entries"] == {"Qwen3MoeForCausalLM": [f"{PKG}.qwen3_moe", "Qwen3MoeForCausalLM"]}


@pytest.mark.parametrize(
    ("arch", "message"),
    [("Missing", "not in the donor's model registry"), ("Ghost", "is not in the donor image")],
)
def test_transplant_plan_refuses(arch, message):
    with pytest.raises(hi.HybridImageError, match=message):
        hi.transplant_plan([arch], DONOR_ARCHS, BASE_ARCHS)


# --------------------------------------------------------------------------- patch_registry

ENTRIES = {
    "Qwen3_5MoeForConditionalGeneration": [f"{PKG}.qwen3_5", "Qwen3_5MoeForConditionalGeneration"]
}


def test_patch_adds_entries_that_parse_back():
    patched = hi.patch_registry(OLD_REGISTRY, ENTRIES)
    merged = parse_registry(patched)
    assert merged["Qwen3_5MoeForConditionalGeneration"] == (
        f"{PKG}.qwen3_5",
        "Qwen3_5MoeForConditionalGeneration",
    )
    assert len(merged) == len(parse_registry(OLD_REGISTRY)) + 1
    # Relative, as releases before 0.22 require; appended at the end of _VLLM_MODELS.
    assert '"Qwen3_5MoeForConditionalGeneration": ("qwen3_5", ' in patched
    assert patched.index("qwen3_5") > patched.index("**_MULTIMODAL_MODELS")
    # Two lines more, nothing else touched.
    added = [line for line in patched.splitlines() if line not in OLD_REGISTRY.splitlines()]
    assert added == [
        "    # Added by dgx_spark.cluster hybrid_image (transplant) from the donor image.",
        '    "Qwen3_5MoeForConditionalGeneration": '
        '("qwen3_5", "Qwen3_5MoeForConditionalGeneration"),',
    ]
    assert [line for line in patched.splitlines() if line not in added] == OLD_REGISTRY.splitlines()


def test_patched_entries_win_over_earlier_ones():
    entries = {"Qwen3MoeForCausalLM": [f"{PKG}.qwen3_moe_v2", "Qwen3MoeForCausalLM"]}
    merged = parse_registry(hi.patch_registry(OLD_REGISTRY, entries))
    assert merged["Qwen3MoeForCausalLM"] == (f"{PKG}.qwen3_moe_v2", "Qwen3MoeForCausalLM")


def test_patch_an_inline_display_without_trailing_comma():
    text = '_A = {"X": ("x", "X")}\n_VLLM_MODELS = {**_A}'
    patched = hi.patch_registry(text, {"Y": ["vllm.models.y", "Y"]})
    ast.parse(patched)
    assert parse_registry(patched)["Y"] == ("vllm.models.y", "Y")  # kept fully qualified
    assert patched.endswith("}\n")


def test_patch_an_empty_display_and_annotated_assignment():
    text = "_VLLM_MODELS: dict[str, tuple[str, str]] = {}\n"
    assert parse_registry(hi.patch_registry(text, ENTRIES)) == {
        "Qwen3_5MoeForConditionalGeneration": (
            f"{PKG}.qwen3_5",
            "Qwen3_5MoeForConditionalGeneration",
        )
    }


def test_patch_without_entries_only_ends_the_text():
    assert hi.patch_registry("_VLLM_MODELS = {}", {}) == "_VLLM_MODELS = {}\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("_OTHER = {}\n", "no _VLLM_MODELS"),
        ("_VLLM_MODELS = dict(_A)\n", "not a dict display"),
        ("_VLLM_MODELS = {\n", "not valid Python"),
    ],
)
def test_patch_refuses(text, message):
    with pytest.raises(hi.HybridImageError, match=message):
        hi.patch_registry(text, ENTRIES)


def test_registry_module_names():
    assert hi.registry_module_name(f"{PKG}.qwen3_5") == "qwen3_5"
    assert hi.registry_module_name("vllm.models.qwen3_5") == "vllm.models.qwen3_5"


# --------------------------------------------------------------------------- real releases

network = pytest.mark.network


def _release(fetch_vllm_sdist, vllm_sdist, version):
    """(registry text, architecture entries as vllm_registry_info reports them)."""
    archive = fetch_vllm_sdist(version)
    files = []
    text = None
    with tarfile.open(archive) as tar:
        for member in tar:
            rel = vllm_sdist.member_relpath(member.name)
            if rel is None or not member.isfile():
                continue
            if rel == REGISTRY_FILE:
                text = tar.extractfile(member).read().decode()
            if rel.endswith(".py") and rel.startswith(tuple(d + "/" for d in MODEL_DIRS)):
                files.append(rel)
    assert text is not None
    return text, architecture_entries(parse_registry(text), files)


@network
@pytest.mark.parametrize("base_version", ["0.10.0", "0.14.1", "0.22.0", "0.33.0"])
def test_patch_real_registries(fetch_vllm_sdist, vllm_sdist, base_version):
    text = _release(fetch_vllm_sdist, vllm_sdist, base_version)[0]
    entries = {
        "DgxSparkTestForCausalLM": [f"{PKG}.dgx_spark_test", "DgxSparkTestForCausalLM"],
        "Qwen3MoeForCausalLM": [f"{PKG}.qwen3_moe", "Qwen3MoeForCausalLM"],
    }
    before = parse_registry(text)
    after = parse_registry(hi.patch_registry(text, entries))
    assert len(after) == len(before) + 1
    assert after["DgxSparkTestForCausalLM"] == (f"{PKG}.dgx_spark_test", "DgxSparkTestForCausalLM")
    assert {k: v for k, v in after.items() if k != "DgxSparkTestForCausalLM"} == before


@network
def test_the_transplant_of_the_story(fetch_vllm_sdist, vllm_sdist):
    """Qwen3.5 MoE from 0.17.0 into 0.14.1: one model file and one registry entry.

    That this is all the static view asks for is why the role also imports the result:
    0.14.1 lacks the qwen3_5 config modules and the Mamba helpers qwen3_5.py imports.
    """
    base_text, base_archs = _release(fetch_vllm_sdist, vllm_sdist, "0.14.1")
    donor_archs = _release(fetch_vllm_sdist, vllm_sdist, "0.17.0")[1]
    wanted = ["Qwen3_5MoeForConditionalGeneration"]
    plan = hi.transplant_plan(wanted, donor_archs, base_archs)
    assert plan["files"] == ["vllm/model_executor/models/qwen3_5.py"]
    assert list(plan["entries"]) == wanted
    patched = parse_registry(hi.patch_registry(base_text, plan["entries"]))
    assert patched[wanted[0]] == (f"{PKG}.qwen3_5", wanted[0])


# --------------------------------------------------------------------------- the inputs

ID_A = "sha256:" + "a" * 64
ID_B = "sha256:" + "b" * 64


@pytest.mark.parametrize(
    ("text", "want"),
    [("2.52.0", (2, 52, 0)), ("2.52", (2, 52, 0)), ("2.60.0", (2, 60, 0)),
     ("2.52.0rc1", (2, 52, 0)), ("", ()), ("none", ())],
)  # fmt: skip
def test_version_tuple(text, want):
    assert hi.version_tuple(text) == want


def test_check_image_present_and_pinned():
    args = ("spark-1", "hybrid_image_base", "vllm-node:latest")
    assert hi.check_image(*args, ID_A, "hybrid_image_base_id", "") == []
    assert hi.check_image(*args, ID_A, "hybrid_image_base_id", ID_A) == []
    (missing,) = hi.check_image(*args, "", "hybrid_image_base_id", "")
    assert missing.startswith("spark-1: hybrid_image_base (vllm-node:latest) is not on this node")
    assert "spark-vllm-docker" in missing and "nothing pulls it" in missing
    (moved,) = hi.check_image(*args, ID_B, "hybrid_image_base_id", ID_A)
    assert f"is {ID_B} here, but hybrid_image_base_id pins {ID_A}" in moved
    (bad_pin,) = hi.check_image(*args, ID_A, "hybrid_image_base_id", "abc")
    assert "hybrid_image_base_id (abc) must be an image ID" in bad_pin
    donor = ("spark-2", "hybrid_image_donor")
    (missing_donor,) = hi.check_image(*donor, "d:1", "", "hybrid_image_donor_id", "")
    assert "hybrid_image_pull: true" in missing_donor
    (empty,) = hi.check_image(*donor, "", "", "hybrid_image_donor_id", "")
    assert "hybrid_image_donor is empty" in empty


def test_is_pinned():
    assert hi.is_pinned("vllm-node:latest", ID_A)
    assert hi.is_pinned("hellohal2064/vllm-qwen3.5-gb10@sha256:" + "c" * 64, "")
    assert not hi.is_pinned("vllm-node:latest", "")


@pytest.mark.parametrize(
    ("strategy", "base", "override", "serve_base", "want"),
    [
        ("overlay", "2.49.0", "", False, "2.49.0"),
        ("overlay", "2.49.0", "2.53.0", False, "2.53.0"),
        ("transplant", "2.49.0", "2.53.0", False, "2.49.0"),
        ("overlay", "2.49.0", "2.53.0", True, "2.49.0"),
    ],
)
def test_cluster_ray(strategy, base, override, serve_base, want):
    assert hi.cluster_ray(strategy, base, override, serve_base)[0] == want


def test_check_ray_token_auth():
    assert hi.check_ray_token_auth("spark-1", "2.60.0", "the base") == []
    assert hi.check_ray_token_auth("spark-1", "2.52.0", "the base") == []
    (old,) = hi.check_ray_token_auth("spark-1", "2.49.2", "the base (hybrid_image_base)")
    assert old.startswith("spark-1: the base (hybrid_image_base) has Ray 2.49.2")
    assert "2.52.0 or newer" in old and "hybrid_image_ray_version" in old
    (none,) = hi.check_ray_token_auth("spark-2", "", "the base (hybrid_image_base)")
    assert "has no Ray" in none


def _build(created, *tags, digest="0"):
    return {"Id": f"sha256:{digest * 64}", "RepoTags": list(tags), "Created": created}


REPO = "dgx-spark/vllm-serving"
# Shaped as docker_host_info's images (Docker's image list), newest last here on purpose.
BUILDS = [
    _build(100, f"{REPO}:aaaaaaaaaaaa", digest="a"),
    _build(200, f"{REPO}:bbbbbbbbbbbb", "backup/mine:kept", digest="b"),
    _build(300, f"{REPO}:cccccccccccc-unverified", digest="c"),
    _build(400, f"{REPO}:dddddddddddd", digest="d"),
    _build(500, f"{REPO}:eeeeeeeeeeee", f"{REPO}:current", digest="e"),
    _build(600, f"{REPO}-molecule:ffffffffffff", digest="f"),
]


def test_builds_to_remove_keeps_the_newest_and_those_in_use():
    # Newest two of the repository: e (the alias's) and d. a is in use by a container.
    tags = hi.builds_to_remove(BUILDS, REPO, 2, ["sha256:" + "a" * 64])
    # Oldest first; another repository's tag on b and the molecule repository are never named.
    assert tags == [f"{REPO}:bbbbbbbbbbbb", f"{REPO}:cccccccccccc-unverified"]


def test_builds_to_remove_with_room_for_every_build_removes_nothing():
    assert hi.builds_to_remove(BUILDS, REPO, 5, []) == []
    assert hi.builds_to_remove([], REPO, 1, []) == []


def test_builds_to_remove_counts_builds_not_tags():
    # The alias's build carries two tags: both are one build, and with keep=1 it is the one kept.
    tags = hi.builds_to_remove(BUILDS, REPO, 1, [])
    assert f"{REPO}:current" not in tags and f"{REPO}:eeeeeeeeeeee" not in tags
    assert tags[0] == f"{REPO}:aaaaaaaaaaaa"
    assert len(tags) == 4


@pytest.mark.parametrize("keep", [0, -1, True, "3"])
def test_builds_to_remove_refuses_a_keep_below_one(keep):
    with pytest.raises(hi.HybridImageError, match="hybrid_image_keep_builds"):
        hi.builds_to_remove(BUILDS, REPO, keep, [])


def test_builds_to_remove_never_lets_rejected_builds_push_a_verified_one_out():
    # Two rejected builds newer than every verified one: kept for inspection, and counted for
    # nothing, so the two newest verified builds (e, the alias's, and d, the one to go back
    # to) stay. c, rejected before d was built, goes with the older verified builds.
    rejected = [
        _build(700, f"{REPO}:gggggggggggg-unverified", digest="7"),
        _build(800, f"{REPO}:hhhhhhhhhhhh-unverified", digest="8"),
    ]
    tags = hi.builds_to_remove(BUILDS + rejected, REPO, 2, [])
    assert tags == [
        f"{REPO}:aaaaaaaaaaaa",
        f"{REPO}:bbbbbbbbbbbb",
        f"{REPO}:cccccccccccc-unverified",
    ]


def test_builds_to_remove_keeps_rejected_builds_while_none_verified():
    only = [_build(100, f"{REPO}:aaaaaaaaaaaa-unverified", digest="a")]
    assert hi.builds_to_remove(only, REPO, 1, []) == []
