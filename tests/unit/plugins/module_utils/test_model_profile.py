"""Model profiles: the shipped ones are whole and sourced, a name picks one, and the decisions
taken on a profile (speculative decoding, the lowest vLLM) refuse what cannot serve."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.filter import model_profile as profile_filter
from ansible_collections.dgx_spark.cluster.plugins.module_utils import model_profile as mp

ROOT = Path(__file__).resolve().parents[4]
SHIPPED = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((ROOT / "profiles").glob("*.yml"))}
SIM = yaml.safe_load((ROOT / "inventories/sim/group_vars/all/model.yml").read_text())


def test_the_five_profiles_of_the_issue_are_shipped():
    assert set(SHIPPED) == {
        "qwen3.5-122b-a10b-fp8", "qwen3.5-122b-a10b-int4-autoround", "gpt-oss-120b",
        "minimax-m2.7-nvfp4", "nemotron-3-super-120b-nvfp4",
    }  # fmt: skip


@pytest.mark.parametrize("name", sorted(SHIPPED) + sorted(SIM["spark_model_profiles"]))
def test_every_profile_is_whole_and_every_value_has_a_dated_source(name):
    profile = SHIPPED.get(name) or SIM["spark_model_profiles"][name]
    assert mp.profile_errors(name, profile) == []
    assert mp.unsourced(profile) == [], "values without a dated source"
    assert profile["serve"]["tensor_parallel_size"] == 2, "every profile is for the pair"
    # Not run on Sparks by this project: said in the profile itself, not only in docs/.
    assert profile["run_on_sparks_by_this_project"] is False


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_speculative_decoding_is_off_unless_stable_at_tp2(name):
    speculative = SHIPPED[name]["speculative"]
    # The setting's default is 0 (off); a profile whose sources show its method unstable at TP 2
    # says so, so the docs table can.
    assert speculative == {} or speculative["stable_at_tp2"] is False


def test_a_profile_fits_the_memory_its_recipe_claims():
    """Weights and KV cache together within 0.8 of two nodes of a Spark's ~121.7 GB."""
    limit_gib = 0.8 * 2 * 121.7e9 / 2**30
    for name, profile in SHIPPED.items():
        need = profile["memory"]["weights_gib"] + profile["memory"]["kv_cache_gib"]
        assert need <= limit_gib, name


def test_pick_names_every_known_profile_when_the_name_is_unknown():
    with pytest.raises(mp.ProfileError) as err:
        mp.pick("qwen4", SHIPPED, {"mine": SHIPPED["gpt-oss-120b"]})
    message = str(err.value)
    assert message.startswith("spark_model_profile is 'qwen4'; allowed: gpt-oss-120b, ")
    assert "mine" in message and "qwen3.5-122b-a10b-fp8" in message


def test_the_inventorys_profile_wins_over_a_shipped_one_of_its_name():
    own = dict(SHIPPED["gpt-oss-120b"], description="mine")
    picked = mp.pick("qwen3.5-122b-a10b-fp8", SHIPPED, {"qwen3.5-122b-a10b-fp8": own})
    assert picked["description"] == "mine"
    assert picked["name"] == "qwen3.5-122b-a10b-fp8"


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"checkpoint": {}}, "checkpoint names either repo (with revision) or local_dir"),
        ({"checkpoint": {"repo": "a/b", "local_dir": "/m"}}, "exactly one"),
        ({"checkpoint": {"repo": "a/b"}}, "checkpoint.revision is missing"),
        ({"image": {"architectures": [], "min_vllm": "0.17.0"}}, "at least one architecture"),
        (
            {"image": {"architectures": ["X"], "min_vllm": "new"}},
            "image.min_vllm must be a vLLM release",
        ),
        ({"image": {"architectures": ["X"]}}, "image.min_vllm is missing"),
        (
            {"memory": {"weights_gib": 1, "kv_cache_gib": "lots"}},
            "memory.kv_cache_gib must be a number",
        ),
        ({"serve": {"served_model_name": "m"}}, "serve.tensor_parallel_size is missing"),
        ({"speculative": {"config": {}}}, "speculative.method is missing"),
        ({"env": ["A=1"]}, "env must be a mapping"),
    ],
)
def test_a_broken_profile_is_refused_naming_its_key(change, words):
    profile = dict(SHIPPED["gpt-oss-120b"], **change)
    errors = mp.profile_errors("mine", profile)
    assert any(words in e for e in errors), errors
    with pytest.raises(mp.ProfileError, match="profile mine"):
        mp.pick("mine", {}, {"mine": profile})


def test_a_profile_name_is_a_plain_word():
    assert mp.profile_errors("My Model", SHIPPED["gpt-oss-120b"]) != []


def test_unsourced_finds_a_value_without_a_source_or_without_a_date():
    profile = dict(SHIPPED["gpt-oss-120b"])
    profile["sources"] = dict(profile["sources"], serve="the recipe")
    profile["env"] = {"NEW": "1"}
    del profile["sources"]["env"]
    missing = mp.unsourced(profile)
    assert "serve.max_model_len" in missing and "env.NEW" in missing
    assert "memory.weights_gib" not in missing


@pytest.mark.parametrize(
    ("tokens", "want"),
    [
        (0, {}),
        ("0", {}),
        (1, {"method": "mtp", "num_speculative_tokens": 1}),
        (3, {"method": "mtp", "num_speculative_tokens": 3}),
    ],
)
def test_speculative_config_follows_the_setting(tokens, want):
    assert mp.speculative_config(SHIPPED["qwen3.5-122b-a10b-fp8"], tokens) == want


def test_the_sims_ngram_method_keeps_its_own_keys():
    profile = SIM["spark_model_profiles"]["sim-tiny-qwen3-moe"]
    assert mp.speculative_config(profile, 2) == {
        "method": "ngram", "num_speculative_tokens": 2,
        "prompt_lookup_max": 3, "prompt_lookup_min": 1,
    }  # fmt: skip


@pytest.mark.parametrize("tokens", [-1, "two", True, None])
def test_speculative_tokens_must_be_a_whole_number(tokens):
    with pytest.raises(mp.ProfileError, match="spark_model_speculative_tokens is .*; allowed"):
        mp.speculative_config(SHIPPED["qwen3.5-122b-a10b-fp8"], tokens)


def test_a_profile_without_a_method_refuses_speculative_tokens():
    profile = dict(SHIPPED["gpt-oss-120b"], name="gpt-oss-120b")
    assert mp.speculative_config(profile, 0) == {}
    with pytest.raises(mp.ProfileError, match="profile gpt-oss-120b names no speculative method"):
        mp.speculative_config(profile, 1)


@pytest.mark.parametrize(
    ("version", "minimum", "serves"),
    [
        ("0.17.0", "0.17.0", True),
        ("0.17.1rc1", "0.17.0", True),
        ("0.17.1.dev12+g1a2b3c", "0.17.1", True),  # main's build of the coming release
        ("0.32.0+cpu", "0.10.0", True),
        ("0.14.1", "0.17.0", False),
        ("0.9", "0.10.1", False),
    ],
)
def test_the_lowest_vllm_release(version, minimum, serves):
    errors = mp.vllm_errors("vllm-node:latest", version, minimum, "p")
    assert (errors == []) is serves, errors
    if not serves:
        assert errors == [
            f"vllm-node:latest has vLLM {version}, older than {minimum}, the lowest profile p is "
            "served by: build or pull a newer one, or pick another spark_model_profile"
        ]


def test_a_version_that_cannot_be_read_is_refused_not_passed():
    assert "cannot be compared" in mp.vllm_errors("img", "", "0.17.0", "p")[0]
    assert "is not a vLLM release" in mp.vllm_errors("img", "0.17.0", "x", "p")[0]


def test_the_filter_reads_the_collections_profiles_and_names_the_setting():
    assert profile_filter.model_profile_pick("gpt-oss-120b")["serve"]["max_model_len"] == 131072
    with pytest.raises(AnsibleFilterError, match="spark_model_profile is 'nope'"):
        profile_filter.model_profile_pick("nope", {})
    with pytest.raises(AnsibleFilterError, match="spark_model_profiles must be a mapping"):
        profile_filter.model_profile_pick("gpt-oss-120b", ["x"])
