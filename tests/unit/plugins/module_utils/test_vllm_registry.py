"""Tests for plugins/module_utils/vllm_registry.py.

Two kinds:

* synthetic registry texts for each rule of the evaluator;
* the real ``registry.py`` of published vLLM releases, read from their source archives
  (fetched and cached by tools/vllm_sdist.py). Each is checked against an oracle: the
  ``*_MODELS`` assignments alone, after an allow-list check of every syntax node (dicts,
  tuples, string constants, names, ``.items()`` comprehensions with ``==``), executed by
  Python itself in a separate isolated interpreter with no builtins.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tarfile
import textwrap
from dataclasses import dataclass

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_registry import (
    REGISTRY_FILE,
    RegistryParseError,
    module_file,
    package_file,
    parse_registry,
    parse_registry_raw,
    qualify_module,
)

PKG = "vllm.model_executor.models"


def reg(source: str) -> dict[str, tuple[str, str]]:
    return parse_registry(textwrap.dedent(source))


# --------------------------------------------------------------------------- synthetic


def test_relative_and_qualified_modules():
    got = reg(
        """
        _TEXT_GENERATION_MODELS = {
            "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
            "DeepseekV4ForCausalLM": ("vllm.models.deepseek_v4", "DeepseekV4ForCausalLM"),
        }
        _VLLM_MODELS = {**_TEXT_GENERATION_MODELS}
        """
    )
    assert got == {
        "LlamaForCausalLM": (f"{PKG}.llama", "LlamaForCausalLM"),
        "DeepseekV4ForCausalLM": ("vllm.models.deepseek_v4", "DeepseekV4ForCausalLM"),
    }


def test_unpacking_order_later_keys_override_first_position_kept():
    got = reg(
        """
        _A_MODELS = {"X": ("a", "A"), "Y": ("a", "Y")}
        _B_MODELS = {"X": ("b", "B"), "W": ("b", "W")}
        _VLLM_MODELS = {
            **_A_MODELS,
            "Z": ("z", "Z"),
            **_B_MODELS,
            "Y": ("c", "C"),
        }
        """
    )
    assert list(got.items()) == [
        ("X", (f"{PKG}.b", "B")),
        ("Y", (f"{PKG}.c", "C")),
        ("Z", (f"{PKG}.z", "Z")),
        ("W", (f"{PKG}.b", "W")),
    ]


def test_repeated_key_in_one_literal_behaves_like_python():
    got = reg(
        """
        _VLLM_MODELS = {"X": ("a", "A"), "Y": ("y", "Y"), "X": ("b", "B")}
        """
    )
    assert list(got.items()) == [("X", (f"{PKG}.b", "B")), ("Y", (f"{PKG}.y", "Y"))]


def test_annotated_assignments_and_bare_annotations():
    got = reg(
        """
        _TEXT_GENERATION_MODELS: dict[str, tuple[str, str]] = {"A": ("a", "A")}
        _LATER_MODELS: dict[str, tuple[str, str]]
        _VLLM_MODELS: dict[str, tuple[str, str]] = {**_TEXT_GENERATION_MODELS}
        """
    )
    assert got == {"A": (f"{PKG}.a", "A")}


def test_bare_annotation_does_not_bind():
    with pytest.raises(RegistryParseError, match="_LATER_MODELS is not defined"):
        reg(
            """
            _LATER_MODELS: dict[str, tuple[str, str]]
            _VLLM_MODELS = {**_LATER_MODELS}
            """
        )


def test_rebinding_uses_value_at_the_time_of_merge():
    got = reg(
        """
        _A_MODELS = {"Old": ("o", "O")}
        _A_MODELS = {"New": ("n", "N")}
        _VLLM_MODELS = {**_A_MODELS}
        _A_MODELS = {"After": ("x", "X")}
        """
    )
    assert got == {"New": (f"{PKG}.n", "N")}


def test_chained_assignment_and_alias():
    got = reg(
        """
        _A_MODELS = _B_MODELS = {"A": ("a", "A")}
        _C_MODELS = _B_MODELS
        _VLLM_MODELS = {**_A_MODELS, **_C_MODELS}
        """
    )
    assert got == {"A": (f"{PKG}.a", "A")}


def test_non_architecture_dicts_do_not_leak_in():
    got = reg(
        """
        import sys
        logger = init_logger(__name__)
        _TEXT_GENERATION_MODELS = {"A": ("a", "A")}
        _VLLM_MODELS = {**_TEXT_GENERATION_MODELS}
        _SUBPROCESS_COMMAND = [sys.executable, "-m", "vllm.model_executor.models.registry"]
        _PREVIOUSLY_SUPPORTED_MODELS = {"Phi3SmallForCausalLM": "0.9.2"}
        _OOT_SUPPORTED_MODELS = {"Foo": "https://example.invalid/foo"}
        _TRIPLES_MODELS = {"B": ("b", "B", "extra")}
        ModelRegistry = _ModelRegistry(
            {a: _Lazy(m, c) for a, (m, c) in _VLLM_MODELS.items()}
        )
        if __name__ == "__main__":
            _run()
        """
    )
    assert got == {"A": (f"{PKG}.a", "A")}


@pytest.mark.parametrize(
    ("definition", "message"),
    [
        ('_X_MODELS = {"Old": "0.9.2"}', "not a \\(module, class\\) pair"),
        ('_X_MODELS = {"B": ("b", "B", "extra")}', "not a \\(module, class\\) pair"),
        ('_X_MODELS = {"B": ("b", 1)}', "unsupported literal"),
        ('_X_MODELS = {1: ("b", "B")}', "unsupported literal"),
        ('_X_MODELS = dict(B=("b", "B"))', "unsupported expression"),
        ('_X_MODELS = {"B": ("b", "B")} | {"C": ("c", "C")}', "unsupported expression"),
        ('_X_MODELS = {"B": ("b", "B")}\n_X_MODELS["C"] = ("c", "C")', "changed by"),
        ('_X_MODELS = {"B": ("b", "B")}\n_X_MODELS.update(C=("c", "C"))', "changed by"),
        ('_X_MODELS = {"B": ("b", "B")}\n_X_MODELS |= {"C": ("c", "C")}', "changed by"),
        ('_X_MODELS = {"B": ("b", "B")}\nfor _X_MODELS in []:\n    pass', "changed by"),
    ],
)
def test_merging_a_non_architecture_map_is_an_error(definition, message):
    text = definition + "\n_VLLM_MODELS = {**_X_MODELS}\n"
    with pytest.raises(
        RegistryParseError, match=f"_X_MODELS is not an architecture map.*{message}"
    ):
        parse_registry(text)


def test_dict_comprehension_filter():
    got = reg(
        """
        _TEXT_GENERATION_MODELS = {
            "AquilaForCausalLM": ("llama", "LlamaForCausalLM"),
            "GemmaForCausalLM": ("gemma", "GemmaForCausalLM"),
            "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
        }
        _EMBEDDING_MODELS = {
            "BertModel": ("bert", "BertEmbeddingModel"),
            **{
                # Multiple models share the same architecture, so we include them all
                k: (mod, arch)
                for k, (mod, arch) in _TEXT_GENERATION_MODELS.items()
                if arch == "LlamaForCausalLM"
            },
            "AquilaForCausalLM": ("aquila", "Overridden"),
        }
        _VLLM_MODELS = {**_EMBEDDING_MODELS}
        """
    )
    assert list(got.items()) == [
        ("BertModel", (f"{PKG}.bert", "BertEmbeddingModel")),
        ("AquilaForCausalLM", (f"{PKG}.aquila", "Overridden")),
        ("LlamaForCausalLM", (f"{PKG}.llama", "LlamaForCausalLM")),
    ]


def test_dict_comprehension_transform_and_boolean_conditions():
    got = reg(
        """
        _T_MODELS = {
            "A": ("m1", "C1"),
            "B": ("m2", "C2"),
            "C": ("m3", "C3"),
        }
        _VLLM_MODELS = {
            k: (arch, mod)
            for k, (mod, arch) in _T_MODELS.items()
            if not (arch == "C1") and (mod != "m3" or k in ("A", "C"))
        }
        """
    )
    assert got == {"B": (f"{PKG}.C2", "m2"), "C": (f"{PKG}.C3", "m3")}


@pytest.mark.parametrize(
    "comprehension",
    [
        '{k: v for k, v in _T_MODELS.items() if v[1].startswith("L")}',
        "{k: _T_MODELS[k] for k in _T_MODELS}",
        "{k: v for k, v in sorted(_T_MODELS.items())}",
        "{k: v for k, v in _T_MODELS.values()}",
        '{k + "X": v for k, v in _T_MODELS.items()}',
        "{k: v for k, v in _T_MODELS.items() if v}",
        "{k: v for k, *v in _T_MODELS.items()}",
        "{k: v for k, v in _T_MODELS.items() if k > 'A'}",
        "{k: v for k, v in _T_MODELS.items() if (w := v)}",
    ],
)
def test_unknown_comprehension_shape_is_an_error(comprehension):
    text = f'_T_MODELS = {{"A": ("a", "A")}}\n_VLLM_MODELS = {{**{comprehension}}}\n'
    with pytest.raises(RegistryParseError, match="line 2: "):
        parse_registry(text)


def test_unknown_shape_in_a_merged_dict_names_that_dict():
    text = textwrap.dedent(
        """
        _T_MODELS = {"A": ("a", "A")}
        _EMBEDDING_MODELS = {**{k: v for k, v in sorted(_T_MODELS.items())}}
        _VLLM_MODELS = {**_T_MODELS, **_EMBEDDING_MODELS}
        """
    )
    with pytest.raises(RegistryParseError) as info:
        parse_registry(text)
    assert "_EMBEDDING_MODELS is not an architecture map" in str(info.value)
    assert "sorted" in str(info.value)


def test_syntax_error():
    with pytest.raises(RegistryParseError, match="does not parse: line 2"):
        parse_registry('_VLLM_MODELS = {\n    "A": ("a", "A"\n')


def test_missing_merged_map():
    with pytest.raises(RegistryParseError, match="no _VLLM_MODELS assignment found"):
        parse_registry('_TEXT_GENERATION_MODELS = {"A": ("a", "A")}\n')


def test_merged_map_only_inside_a_block_is_not_guessed():
    text = 'if True:\n    _VLLM_MODELS = {"A": ("a", "A")}\n'
    with pytest.raises(RegistryParseError, match="changed by a statement at line 1"):
        parse_registry(text)


def test_empty_merged_map():
    with pytest.raises(RegistryParseError, match="empty"):
        parse_registry("_VLLM_MODELS = {}\n")


def test_error_class():
    assert issubclass(RegistryParseError, ValueError)


def test_raw_keeps_modules_as_written():
    text = '_VLLM_MODELS = {"A": ("a", "A"), "B": ("vllm.models.b", "B")}\n'
    assert parse_registry_raw(text) == {"A": ("a", "A"), "B": ("vllm.models.b", "B")}


def test_module_paths():
    assert qualify_module("qwen3_5") == f"{PKG}.qwen3_5"
    assert qualify_module("vllm.models.beam") == "vllm.models.beam"
    assert module_file(f"{PKG}.qwen3_5") == "vllm/model_executor/models/qwen3_5.py"
    assert package_file("vllm.models.beam") == "vllm/models/beam/__init__.py"
    for bad in ("", "vllm..x", "vllm/x", "vllm.x-y", "../x"):
        with pytest.raises(ValueError):
            module_file(bad)


# --------------------------------------------------------------------------- real releases


@dataclass(frozen=True)
class Expected:
    sha256: str
    maps: tuple[str, ...]  # the dicts merged into _VLLM_MODELS, in order
    count: int  # entries of the merged registry
    qualified: int  # entries whose module is written fully qualified (vllm.*)


_OLD = ("TEXT_GENERATION", "EMBEDDING", "CROSS_ENCODER", "MULTIMODAL", "SPECULATIVE_DECODING")
_MID = (*_OLD, "TRANSFORMERS_SUPPORTED", "TRANSFORMERS_BACKEND")
_NEW = (
    "TEXT_GENERATION",
    "EMBEDDING",
    "LATE_INTERACTION",
    "REWARD",
    "TOKEN_CLASSIFICATION",
    "SEQUENCE_CLASSIFICATION",
    "MULTIMODAL",
    "SPECULATIVE_DECODING",
    "TRANSFORMERS_SUPPORTED",
    "TRANSFORMERS_BACKEND",
)

# Counts measured with parse_registry and, independently, with the executing oracle below;
# the sha256 pins the exact archive they were measured on.
RELEASES = {
    "0.10.0": Expected(
        "a44e9013db26082a82c3931ed8772ac884d6d60566d36ecdb0e8dc01c65b241a",
        (*_OLD, "TRANSFORMERS"),
        177,
        0,
    ),
    "0.10.1": Expected(
        "99d00498f25b94767bb2696e88feb67730677dae605c9b8af99492dc3c34492d", _MID, 191, 0
    ),
    "0.11.0": Expected(
        "f435a64c24e9c4178d657a76f8edd8548ddc444012f7d06a9f79ac3a6392bfae", _MID, 213, 0
    ),
    "0.14.1": Expected(
        "c7c6d0a729d29e70ac10baacbc7186930da24f8ae34f60451330527ff0be84ac", _MID, 262, 0
    ),
    "0.17.0": Expected(
        "b0b62e58ef4eb633ef371f2726976372cf6dfcb7ff2ea9ddf7194c1930d5629a", _MID, 305, 0
    ),
    "0.18.0": Expected(
        "9a1bee091db8dbb4664a2a09cd9c61912e9912a44af1ce12b8593a231d05971c", _NEW, 317, 0
    ),
    "0.19.0": Expected(
        "81e59cf87175e7a62eb8d9acf5989484bbd17089d5eface353f89067bda282d9", _NEW, 323, 0
    ),
    "0.22.0": Expected(
        "6d41581a9e5288cd69278518a550c6d7ce510ae27a506556a3427d01284be7fe", _NEW, 361, 2
    ),
    "0.28.0": Expected(
        "ac96dd0ec5be9c13f2aa4bfb50498c4727110406f6e4980b58a4097e4d18634a", _NEW, 378, 15
    ),
    "0.32.0": Expected(
        "d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad", _NEW, 391, 29
    ),
    "0.33.0": Expected(
        "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112", _NEW, 415, 37
    ),
}

_ORACLE = r"""
import ast, json, sys

tree = ast.parse(sys.stdin.read())
body = []
for stmt in tree.body:
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        stmt = ast.Assign(targets=[stmt.target], value=stmt.value, lineno=stmt.lineno)
    if isinstance(stmt, ast.Assign) and all(
        isinstance(t, ast.Name) and t.id.endswith("_MODELS") for t in stmt.targets
    ):
        body.append(stmt)
module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
allowed = (
    ast.Module, ast.Assign, ast.Name, ast.Load, ast.Store, ast.Dict, ast.Tuple,
    ast.Constant, ast.DictComp, ast.comprehension, ast.Call, ast.Attribute, ast.Compare,
    ast.Eq,
)
for node in ast.walk(module):
    bad = not isinstance(node, allowed)
    bad |= isinstance(node, ast.Constant) and not isinstance(node.value, str)
    bad |= isinstance(node, ast.Attribute) and node.attr != "items"
    bad |= isinstance(node, ast.Call) and (
        node.args or node.keywords or not isinstance(node.func, ast.Attribute)
    )
    if bad:
        sys.exit(f"oracle refuses line {getattr(node, 'lineno', '?')}: {ast.dump(node)[:200]}")
namespace = {"__builtins__": {}}
exec(compile(module, "<registry dicts>", "exec"), namespace)
out = {}
for name, value in namespace.items():
    if name.endswith("_MODELS") and all(
        isinstance(v, tuple) and len(v) == 2 for v in value.values()
    ):
        out[name] = list(value.items())
json.dump(out, sys.stdout)
"""


def oracle(text: str) -> dict[str, dict[str, tuple[str, str]]]:
    """Every architecture map ``*_MODELS`` of the text, computed by Python (see above)."""
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _ORACLE],
        input=text,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return {
        name: {arch: (mod, cls) for arch, (mod, cls) in items}
        for name, items in json.loads(proc.stdout).items()
    }


@dataclass(frozen=True)
class Release:
    version: str
    expected: Expected
    text: str  # registry.py
    members: frozenset[str]  # archive member paths below the top directory
    oracle: dict[str, dict[str, tuple[str, str]]]
    registry: dict[str, tuple[str, str]]

    def at_least(self, version: str) -> bool:
        return _key(self.version) >= _key(version)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@pytest.fixture(scope="module", params=sorted(RELEASES, key=_key))
def release(request, fetch_vllm_sdist, vllm_sdist) -> Release:
    version = request.param
    archive = fetch_vllm_sdist(version)
    expected = RELEASES[version]
    assert vllm_sdist.sha256_file(archive) == expected.sha256
    members, text = set(), None
    with tarfile.open(archive) as tar:  # one pass: the member list and registry.py
        for member in tar:
            rel = vllm_sdist.member_relpath(member.name)
            if rel is None:
                continue
            members.add(rel)
            if rel == REGISTRY_FILE and member.isfile():
                text = tar.extractfile(member).read().decode()
    assert text is not None, f"{archive} has no {REGISTRY_FILE}"
    return Release(version, expected, text, frozenset(members), oracle(text), parse_registry(text))


network = pytest.mark.network


@network
def test_read_member_gives_the_registry(fetch_vllm_sdist, vllm_sdist):
    archive = fetch_vllm_sdist("0.33.0")
    text = vllm_sdist.read_member(archive, REGISTRY_FILE)
    assert "_VLLM_MODELS = {" in text
    assert parse_registry(text)["Qwen3_5MoeForCausalLM"][1] == "Qwen3_5MoeForCausalLM"


@network
def test_count(release):
    assert len(release.registry) == release.expected.count


@network
def test_matches_the_executing_oracle(release):
    raw = parse_registry_raw(release.text)
    assert list(raw.items()) == list(release.oracle["_VLLM_MODELS"].items())


@network
def test_merged_dicts(release):
    tree = ast.parse(release.text)
    (merge,) = [
        s
        for s in tree.body
        if isinstance(s, ast.Assign) and getattr(s.targets[0], "id", "") == "_VLLM_MODELS"
    ]
    names = [v.id for k, v in zip(merge.value.keys, merge.value.values, strict=True) if k is None]
    assert names == [f"_{m}_MODELS" for m in release.expected.maps]
    merged = {}
    for name in names:
        merged.update(release.oracle[name])
    assert parse_registry_raw(release.text) == merged


@network
def test_llama(release):
    assert release.registry["LlamaForCausalLM"] == (f"{PKG}.llama", "LlamaForCausalLM")


@network
def test_qwen3_5(release):
    reg = release.registry
    if release.at_least("0.17.0"):
        for cls in ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"):
            assert reg[cls] == (f"{PKG}.qwen3_5", cls)
        for cls in ("Qwen3_5MTP", "Qwen3_5MoeMTP"):
            assert reg[cls] == (f"{PKG}.qwen3_5_mtp", cls)
    else:
        assert not [a for a in reg if a.startswith("Qwen3_5")]
    for cls in ("Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"):
        if release.at_least("0.28.0"):
            assert reg[cls] == (f"{PKG}.qwen3_5", cls)
        else:
            assert cls not in reg


@network
def test_fully_qualified_modules(release):
    qualified = {a: v for a, v in release.registry.items() if not v[0].startswith(f"{PKG}.")}
    assert len(qualified) == release.expected.qualified
    assert all(mod.startswith("vllm.") for mod, _cls in qualified.values())
    if release.at_least("0.22.0"):
        assert qualified["DeepseekV4ForCausalLM"] == (
            "vllm.models.deepseek_v4",
            "DeepseekV4ForCausalLM",
        )


@network
def test_every_module_is_in_the_archive(release):
    missing = sorted(
        mod
        for mod in {mod for mod, _cls in release.registry.values()}
        if module_file(mod) not in release.members and package_file(mod) not in release.members
    )
    assert not missing


@network
def test_non_architecture_maps_left_out(release):
    tree = ast.parse(release.text)
    for stmt in tree.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else None
        name = getattr(target, "id", "")
        if name in ("_PREVIOUSLY_SUPPORTED_MODELS", "_OOT_SUPPORTED_MODELS"):
            previous = ast.literal_eval(stmt.value)
            assert previous, name
            assert all(isinstance(v, str) for v in previous.values()), name
            assert set(previous).isdisjoint(release.registry), name
            assert name not in release.oracle  # not a map of 2-tuples


@network
def test_comprehension_entries(release):
    """_EMBEDDING_MODELS on its own, comprehension included, against the oracle."""
    embedding = parse_registry_raw(release.text + "\n_VLLM_MODELS = {**_EMBEDDING_MODELS}\n")
    assert list(embedding.items()) == list(release.oracle["_EMBEDDING_MODELS"].items())
    text_generation = release.oracle["_TEXT_GENERATION_MODELS"]
    llama_like = {a: v for a, v in text_generation.items() if v[1] == "LlamaForCausalLM"}
    assert "LLaMAForCausalLM" in llama_like
    literal_keys = {
        k.value
        for s in ast.parse(release.text).body
        if isinstance(s, ast.Assign) and getattr(s.targets[0], "id", "") == "_EMBEDDING_MODELS"
        for k in s.value.keys
        if k is not None
    }
    for arch, value in llama_like.items():
        if arch not in literal_keys:  # only the comprehension puts it there
            assert embedding[arch] == value
