"""Tests for plugins/filter/model_cache.py: the role's filters as Ansible calls them."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.filter import model_cache as flt

FILTERS = {f"model_cache_{op}": run for op, run in flt.OPERATIONS.items()}


def test_capacity_takes_mib_from_facts():
    memory = {"spark-1": 121_000, "spark-2": 121_000}
    assert FILTERS["model_cache_capacity"](119 * 10**9, memory, 0.8) == []
    (error,) = FILTERS["model_cache_capacity"]("1000000", memory, "0.0000001")
    assert "model_cache_max_fraction_of_memory (1e-07)" in error


def test_disk_names_the_node_and_variable():
    (error,) = FILTERS["model_cache_disk"](200, "spark-2", "/m", 100)
    assert error.startswith("spark-2: model_cache_dir (/m) has 100 B free")
    assert FILTERS["model_cache_disk"]("0", "spark-2", "/m", "0") == []


def test_repo_dir():
    assert FILTERS["model_cache_repo_dir"]("Qwen/Qwen3.5-122B-A10B-FP8") == (
        "models--Qwen--Qwen3.5-122B-A10B-FP8"
    )
    with pytest.raises(AnsibleFilterError, match="model_cache_repo_id"):
        FILTERS["model_cache_repo_dir"]("not-a-repo")


def test_hf_manifest_errors_are_filter_errors():
    with pytest.raises(AnsibleFilterError, match="no commit hash"):
        FILTERS["model_cache_hf_manifest"]({"sha": "main", "siblings": []})


def test_hf_manifest_default_patterns():
    info = {"sha": "a" * 40, "siblings": [{"rfilename": "config.json", "size": 5}]}
    assert FILTERS["model_cache_hf_manifest"](info)["files"] == {"config.json": {"size": 5}}


def test_rsync_without_stats_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="--stats"):
        FILTERS["model_cache_rsync"]("")


def test_problems_name_each_file_by_kind():
    from ansible_collections.dgx_spark.cluster.plugins.module_utils import model_manifest as mm

    head = {
        "model-00001-of-00002.safetensors": {"size": 10, "sha256": "a" * 64},
        "model-00002-of-00002.safetensors": {"size": 10, "sha256": "b" * 64},
        "config.json": {"size": 5, "sha256": "c" * 64},
    }
    worker = {
        "files": {
            "model-00001-of-00002.safetensors": {"size": 10, "sha256": "f" * 64},
            "config.json": {"size": 5, "sha256": "c" * 64},
        }
    }
    line = flt.model_cache_problems(mm.compare(head, worker))
    assert line == (
        "missing (1): model-00002-of-00002.safetensors; "
        "SHA-256 differs (1): model-00001-of-00002.safetensors"
    )


def test_problems_of_a_clean_copy():
    from ansible_collections.dgx_spark.cluster.plugins.module_utils import model_manifest as mm

    files = {"config.json": {"size": 5}}
    assert flt.model_cache_problems(mm.compare(files, {"files": files})) == "no problems"
    with pytest.raises(AnsibleFilterError, match="expected a dict"):
        flt.model_cache_problems(["missing"])


def test_stale_names_the_files_to_copy_and_refuses_what_is_no_manifest():
    source = {
        "config.json": {"size": 5, "mtime_ns": 20},
        "w.safetensors": {"size": 9, "mtime_ns": 5},
    }
    copy = {"config.json": {"size": 5, "mtime_ns": 10}, "w.safetensors": {"size": 9, "mtime_ns": 6}}
    assert FILTERS["model_cache_stale"](source, copy) == ["config.json"]
    with pytest.raises(AnsibleFilterError, match="two manifests"):
        FILTERS["model_cache_stale"](source, None)
