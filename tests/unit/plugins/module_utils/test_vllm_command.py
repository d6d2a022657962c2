"""The vllm serve command lines and environments the vllm_serve role renders."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.dgx_spark.cluster.plugins.module_utils import vllm_command

ROOT = Path(__file__).resolve().parents[4]
DEFAULTS = DataLoader().load_from_file(
    str(ROOT / "roles/vllm_serve/defaults/main.yml"), trusted_as_template=True
)
SHARED = DataLoader().load_from_file(
    str(ROOT / "roles/spark_defaults/defaults/main.yml"), trusted_as_template=True
)


def _rendered(value, profile: str = "qwen3.5-122b-a10b-fp8"):
    """A default as Ansible gives it: templated over spark_defaults' and this role's defaults,
    with the model profile ``profile`` (the port: "{{ spark_serving_port }}" is 8000)."""
    variables = {**SHARED, **DEFAULTS, "spark_model_profile": profile}
    return Templar(loader=DataLoader(), variables=variables).template(value)


def production_settings(profile: str = "qwen3.5-122b-a10b-fp8", **overrides) -> dict:
    """The role's defaults, as vars/main.yml maps them, for the recipe of ``profile``."""
    settings = {
        key.removeprefix("vllm_serve_"): _rendered(value, profile)
        for key, value in DEFAULTS.items()
        if key.startswith("vllm_serve_") and key != "vllm_serve_model_path"
    }
    settings["model_path"] = "/var/lib/dgx-spark/models/Qwen3.5-122B-A10B-FP8"
    settings.update(overrides)
    return settings


def test_ray_backend_head_renders_the_recipe():
    args = vllm_command.serve_args(
        production_settings(), backend="ray", node_rank=0, nnodes=2, master_addr="198.51.100.11"
    )
    assert args == [
        "/var/lib/dgx-spark/models/Qwen3.5-122B-A10B-FP8",
        "--tensor-parallel-size", "2",
        "--distributed-executor-backend", "ray",
        "--max-model-len", "262144",
        "--gpu-memory-utilization", "0.7",
        "--max-num-batched-tokens", "8192",
        "--max-num-seqs", "4",
        "--enable-prefix-caching",
        "--language-model-only",
        "--served-model-name", "Qwen3.5-122B-A10B-FP8",
        "--host", "0.0.0.0",
        "--port", "8000",
        "--reasoning-parser", "qwen3",
        "--enable-auto-tool-choice",
        "--tool-call-parser", "qwen3_coder",
    ]  # fmt: skip
    assert not any("api" in a.lower() for a in args), "the API key never goes on the command line"


def test_ray_backend_workers_run_no_vllm_of_their_own():
    assert (
        vllm_command.serve_args(
            production_settings(), backend="ray", node_rank=1, nnodes=2, master_addr="x"
        )
        == []
    )


def test_ray_backend_environment():
    env = vllm_command.serve_env(
        production_settings(),
        backend="ray",
        ray_address="198.51.100.11:6379",
        token_path="/etc/dgx-spark-vllm/ray-token",
        rpc_dir="/run/dgx-spark-rpc",
    )
    assert env == {
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "RAY_ADDRESS": "198.51.100.11:6379",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": "/etc/dgx-spark-vllm/ray-token",
        "VLLM_RPC_BASE_PATH": "/run/dgx-spark-rpc",
    }


def test_mtp_speculative_config_is_compact_json():
    settings = production_settings(
        speculative_config={"method": "mtp", "num_speculative_tokens": 1}
    )
    args = vllm_command.serve_args(settings, backend="ray", node_rank=0, nnodes=2, master_addr="x")
    i = args.index("--speculative-config")
    assert args[i + 1] == '{"method":"mtp","num_speculative_tokens":1}'


def test_multinode_head_and_headless_worker_agree_on_engine_settings():
    settings = production_settings(load_format="dummy")
    head = vllm_command.serve_args(
        settings, backend="multinode", node_rank=0, nnodes=2, master_addr="198.51.100.11"
    )
    worker = vllm_command.serve_args(
        settings, backend="multinode", node_rank=1, nnodes=2, master_addr="198.51.100.11"
    )
    launcher = ["--nnodes", "2", "--master-addr", "198.51.100.11", "--master-port", "29501"]
    for args in (head, worker):
        for flag, value in zip(launcher[::2], launcher[1::2], strict=True):
            assert args[args.index(flag) + 1] == value
        assert args[args.index("--load-format") + 1] == "dummy"
        assert args[args.index("--max-model-len") + 1] == "262144"
    assert head[head.index("--node-rank") + 1] == "0" and "--headless" not in head
    assert worker[worker.index("--node-rank") + 1] == "1" and worker[-1] == "--headless"
    assert "--port" in head and "--port" not in worker
    assert "RAY_ADDRESS" not in vllm_command.serve_env(
        settings, backend="multinode", ray_address="x", token_path="y", rpc_dir="z"
    )


def test_empty_settings_are_left_to_vllm():
    settings = production_settings(
        gpu_memory_utilization="", reasoning_parser="", tool_call_parser="",
        enable_auto_tool_choice=False, enable_prefix_caching=False, max_num_batched_tokens=None,
    )  # fmt: skip
    args = vllm_command.serve_args(settings, backend="ray", node_rank=0, nnodes=2, master_addr="x")
    left_out = {
        "--gpu-memory-utilization", "--reasoning-parser", "--tool-call-parser",
        "--enable-auto-tool-choice", "--enable-prefix-caching", "--max-num-batched-tokens",
    }  # fmt: skip
    assert not left_out & set(args)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "mpi"}, "vllm_serve_backend must be one of ray, multinode, got 'mpi'"),
        ({"node_rank": 2}, "node rank 2 is outside 0..1"),
    ],
)
def test_bad_settings(kwargs, message):
    call = {"backend": "ray", "node_rank": 0, "nnodes": 2, "master_addr": "x", **kwargs}
    with pytest.raises(vllm_command.ServeConfigError, match=message):
        vllm_command.serve_args(production_settings(), **call)


def test_model_path_required():
    with pytest.raises(vllm_command.ServeConfigError, match="vllm_serve_model_path"):
        vllm_command.serve_args(
            production_settings(model_path=""),
            backend="ray",
            node_rank=0,
            nnodes=2,
            master_addr="x",
        )


@pytest.mark.parametrize(
    ("tp", "pp", "gpus", "ok"),
    [
        (2, 1, {"spark-1": 1, "spark-2": 1}, True),
        (4, 1, {"a": 1, "b": 1, "c": 1, "d": 1}, True),
        (2, 2, {"a": 1, "b": 1, "c": 1, "d": 1}, True),
        (1, 1, {"spark-1": 1, "spark-2": 1}, False),
        (4, 1, {"spark-1": 1, "spark-2": 1}, False),
    ],
)
def test_parallel_sizes_against_declared_gpus(tp, pp, gpus, ok):
    if ok:
        vllm_command.check_parallel_sizes(tp, pp, gpus)
    else:
        with pytest.raises(
            vllm_command.ServeConfigError,
            match=rf"vllm_serve_tensor_parallel_size \({tp}\) x vllm_serve_pipeline_parallel_size",
        ):
            vllm_command.check_parallel_sizes(tp, pp, gpus)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--tensor-parallel-size", "4"],
            "repeats --tensor-parallel-size, which the role sets "
            "itself: set vllm_serve_tensor_parallel_size instead",
        ),
        (["--api-key=x"], "repeats --api-key, which the role sets itself: set vllm_serve_api_key"),
        (["-tp", "2"], "repeats -tp"),
        ("--enforce-eager", "must be a list of strings, got str"),
        ([["--x"]], "must hold strings, got ['--x'] (list)"),
    ],
)
def test_extra_args_that_repeat_a_managed_flag_are_refused(extra, message):
    settings = production_settings(extra_args=extra)
    with pytest.raises(vllm_command.ServeConfigError, match=re.escape(message)):
        vllm_command.serve_args(settings, backend="ray", node_rank=0, nnodes=2, master_addr="x")


def test_the_key_middleware_is_the_heads_only():
    settings = production_settings(middleware=["dgx_spark_auth.require_key"])
    head = vllm_command.serve_args(
        settings, backend="multinode", node_rank=0, nnodes=2, master_addr="a"
    )
    worker = vllm_command.serve_args(
        settings, backend="multinode", node_rank=1, nnodes=2, master_addr="a"
    )
    assert head[-2:] == ["--middleware", "dgx_spark_auth.require_key"]
    assert "--middleware" not in worker


def test_the_production_settings_have_no_errors():
    assert vllm_command.setting_errors(production_settings()) == []


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"port": 70000}, "vllm_serve_port is 70000; allowed: an integer 1-65535"),
        ({"port": 0}, "vllm_serve_port is 0; allowed: an integer 1-65535"),
        ({"port": "http"}, "vllm_serve_port is 'http'; allowed: an integer 1-65535"),
        ({"master_port": 8000}, "vllm_serve_port and vllm_serve_master_port are both 8000"),
        ({"max_model_len": -5}, "vllm_serve_max_model_len is -5; allowed: an integer >= 1"),
        ({"max_model_len": 1.5}, "vllm_serve_max_model_len is 1.5"),
        ({"gpu_memory_utilization": 0}, "vllm_serve_gpu_memory_utilization is 0; allowed: a"),
        ({"gpu_memory_utilization": 1.2}, "vllm_serve_gpu_memory_utilization is 1.2"),
        ({"gpu_memory_utilization": True}, "vllm_serve_gpu_memory_utilization is True"),
        ({"max_num_batched_tokens": 0}, "vllm_serve_max_num_batched_tokens is 0"),
        ({"max_num_seqs": 0}, "vllm_serve_max_num_seqs is 0; allowed: an integer >= 1"),
        ({"max_cudagraph_capture_size": 2.5}, "vllm_serve_max_cudagraph_capture_size is 2.5"),
        ({"tensor_parallel_size": 0}, "vllm_serve_tensor_parallel_size is 0; allowed: an integer"),
        ({"pipeline_parallel_size": -1}, "vllm_serve_pipeline_parallel_size is -1"),
        ({"served_model_name": " "}, "vllm_serve_served_model_name is empty"),
    ],
)
def test_settings_vllm_would_refuse_are_named(override, message):
    errors = vllm_command.setting_errors(production_settings(**override))
    assert any(e.startswith(message) for e in errors), errors


def test_the_capture_bound_is_passed_when_set():
    args = vllm_command.serve_args(
        production_settings(max_cudagraph_capture_size=16, max_num_seqs=""),
        backend="ray", node_rank=0, nnodes=2, master_addr="198.51.100.11",
    )  # fmt: skip
    assert "--max-num-seqs" not in args
    assert args[args.index("--max-cudagraph-capture-size") + 1] == "16"


def test_empty_values_leave_vllms_defaults():
    settings = production_settings(
        max_model_len="", gpu_memory_utilization="", max_num_batched_tokens=None
    )
    assert vllm_command.setting_errors(settings) == []


def _inventory(name: str) -> dict:
    """An inventory's group_vars/all over the role's defaults (the values a run sees)."""
    seen = {**SHARED, **DEFAULTS}
    for path in sorted((ROOT / "inventories" / name / "group_vars" / "all").glob("*.yml")):
        seen.update(DataLoader().load_from_file(str(path), trusted_as_template=True) or {})
    seen["inventory_dir"] = str(ROOT / "inventories" / name)
    templar = Templar(loader=DataLoader(), variables=seen)
    return {
        key: templar.template(value) for key, value in seen.items() if key.startswith("vllm_serve_")
    } | {key: seen[key] for key in ("spark_hardware",) if key in seen}


def _auth_errors(seen: dict) -> list[str]:
    return vllm_command.auth_errors(
        len(seen["vllm_serve_api_key"]) > 0,
        bool(seen.get("spark_hardware", False)),
        bool(seen["vllm_serve_allow_unauthenticated"]),
        seen["vllm_serve_port"],
    )


def test_the_sparks_inventory_without_its_vaulted_key_is_refused():
    """inventories/sparks sets spark_hardware and no key (the key belongs in a vault): as it
    ships, the run is refused before any change, naming the variable and both ways out."""
    sparks = _inventory("sparks")
    assert sparks["spark_hardware"] is True and sparks["vllm_serve_api_key"] == ""
    (error,) = _auth_errors(sparks)
    assert error.startswith("vllm_serve_api_key is empty, so anyone who reaches port 8000")
    assert "ansible-vault encrypt_string --name vllm_serve_api_key" in error
    assert "vllm_serve_allow_unauthenticated: true" in error
    assert _auth_errors({**sparks, "vllm_serve_api_key": "sk-vaulted"}) == []
    assert _auth_errors({**sparks, "vllm_serve_allow_unauthenticated": True}) == []


def test_the_sim_serves_with_its_key_and_would_not_need_one():
    sim = _inventory("sim")
    assert sim["spark_hardware"] is False and sim["vllm_serve_api_key"]
    assert _auth_errors(sim) == []
    assert _auth_errors({**sim, "vllm_serve_api_key": ""}) == []


@pytest.mark.parametrize(
    ("key_set", "hardware", "allow", "refused"),
    [
        (False, True, False, True),
        (True, True, False, False),
        (False, True, True, False),
        (False, False, False, False),
        # Only a real bool counts (the role passes `| bool`): anything else is no opt-out.
        (False, True, "true", True),
        ("yes", True, False, True),
    ],
)
def test_auth_errors(key_set, hardware, allow, refused):
    errors = vllm_command.auth_errors(key_set, hardware, allow, 8000)
    assert bool(errors) is refused, errors


def test_auth_errors_never_quote_a_key():
    """The rule gets only whether a key is set; a set key passes, whatever it is."""
    assert vllm_command.auth_errors(True, True, False, 8000) == []


def test_another_profile_renders_its_own_recipe():
    """gpt-oss-120b: its context, KV cache type, parsers and environment, from profiles/."""
    settings = production_settings("gpt-oss-120b")
    args = vllm_command.serve_args(
        settings, backend="ray", node_rank=0, nnodes=2, master_addr="198.51.100.11"
    )
    assert args[args.index("--max-model-len") + 1] == "131072"
    assert args[args.index("--kv-cache-dtype") + 1] == "fp8"
    assert args[args.index("--reasoning-parser") + 1] == "openai_gptoss"
    assert args[args.index("--tool-call-parser") + 1] == "openai"
    assert "--language-model-only" not in args and "--max-num-seqs" not in args
    assert settings["env"] == {"VLLM_USE_FLASHINFER_MOE_MXFP4_MXFP8": "1"}


def test_the_chat_template_kwargs_and_kv_cache_type_reach_the_head_only_where_set():
    settings = production_settings(chat_template_kwargs={"enable_thinking": False})
    head = vllm_command.serve_args(
        settings, backend="multinode", node_rank=0, nnodes=2, master_addr="198.51.100.11"
    )
    worker = vllm_command.serve_args(
        settings, backend="multinode", node_rank=1, nnodes=2, master_addr="198.51.100.11"
    )
    assert head[head.index("--default-chat-template-kwargs") + 1] == '{"enable_thinking":false}'
    assert "--default-chat-template-kwargs" not in worker, "an API setting: the head's alone"
    assert "--kv-cache-dtype" not in head, "auto leaves vLLM's own"
    fp8 = production_settings(kv_cache_dtype="fp8")
    for rank in (0, 1):
        args = vllm_command.serve_args(
            fp8, backend="multinode", node_rank=rank, nnodes=2, master_addr="198.51.100.11"
        )
        assert args[args.index("--kv-cache-dtype") + 1] == "fp8", "every rank agrees on it"


def test_speculative_tokens_turn_on_the_profiles_method():
    settings = production_settings(
        speculative_config=_rendered(
            trust_as_template(
                "{{ spark_profile | dgx_spark.cluster.model_profile('speculative', 1) }}"
            )
        )
    )
    args = vllm_command.serve_args(
        settings, backend="ray", node_rank=0, nnodes=2, master_addr="198.51.100.11"
    )
    assert (
        args[args.index("--speculative-config") + 1]
        == '{"method":"mtp","num_speculative_tokens":1}'
    )
