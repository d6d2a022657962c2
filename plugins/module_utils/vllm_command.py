# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The `vllm serve` command line and environment of one node, as pure functions.

Two backends serve one model across several nodes:
- ``ray``: the head runs ``vllm serve --distributed-executor-backend ray`` as a driver of the
  Ray cluster that ray_cluster formed; workers run nothing of their own.
- ``multinode``: vLLM's own launcher (``--nnodes/--node-rank/--master-addr/--master-port``);
  every node runs ``vllm serve``, the workers with ``--headless``.
"""

from __future__ import annotations

import json

BACKENDS = ("ray", "multinode")


class ServeConfigError(ValueError):
    """Settings that cannot make a working command; the message names the variable."""


# Flags the role sets itself, and the variable that sets each; extra args must not repeat them.
MANAGED_FLAGS = {
    "--tensor-parallel-size": "vllm_serve_tensor_parallel_size",
    "-tp": "vllm_serve_tensor_parallel_size",
    "--pipeline-parallel-size": "vllm_serve_pipeline_parallel_size",
    "-pp": "vllm_serve_pipeline_parallel_size",
    "--distributed-executor-backend": "vllm_serve_backend",
    "--nnodes": "vllm_serve_backend (from the inventory)",
    "--node-rank": "vllm_serve_backend (from the inventory)",
    "--master-addr": "spark_fast_ip of the head",
    "--master-port": "vllm_serve_master_port",
    "--headless": "vllm_serve_backend (workers of multinode)",
    "--max-model-len": "vllm_serve_max_model_len",
    "--load-format": "vllm_serve_load_format",
    "--gpu-memory-utilization": "vllm_serve_gpu_memory_utilization",
    "--max-num-batched-tokens": "vllm_serve_max_num_batched_tokens",
    "--max-num-seqs": "vllm_serve_max_num_seqs",
    "--max-cudagraph-capture-size": "vllm_serve_max_cudagraph_capture_size",
    "--enable-prefix-caching": "vllm_serve_enable_prefix_caching",
    "--language-model-only": "vllm_serve_language_model_only",
    "--speculative-config": "vllm_serve_speculative_config",
    "--kv-cache-dtype": "vllm_serve_kv_cache_dtype",
    "--default-chat-template-kwargs": "vllm_serve_chat_template_kwargs",
    "--served-model-name": "vllm_serve_served_model_name",
    "--host": "vllm_serve_host",
    "--port": "vllm_serve_port",
    "--reasoning-parser": "vllm_serve_reasoning_parser",
    "--enable-auto-tool-choice": "vllm_serve_enable_auto_tool_choice",
    "--tool-call-parser": "vllm_serve_tool_call_parser",
    "--api-key": "vllm_serve_api_key",
    "--middleware": "vllm_serve_api_key (the role's key middleware)",
}


def _number(value):
    if isinstance(value, bool):
        raise ValueError(value)
    return float(value)


def setting_errors(settings: dict) -> list[str]:
    """What vLLM would refuse at start, found before anything is touched; each names its variable.

    Ports 1..65535, distinct; positive sizes; a memory fraction in (0, 1]; lengths and token
    budgets at least 1 or empty (vLLM's default); a served name. Empty values are allowed
    where the role leaves vLLM's default.
    """
    errors: list[str] = []

    def check(name: str, ok, allowed: str, optional: bool = False) -> None:
        value = settings.get(name)
        if optional and value in (None, ""):
            return
        try:
            good = ok(_number(value))
        except (TypeError, ValueError):
            good = False
        if not good:
            errors.append(f"vllm_serve_{name} is {value!r}; allowed: {allowed}")

    check("port", lambda v: v.is_integer() and 1 <= v <= 65535, "an integer 1-65535")
    check("master_port", lambda v: v.is_integer() and 1 <= v <= 65535, "an integer 1-65535")
    check("tensor_parallel_size", lambda v: v.is_integer() and v >= 1, "an integer >= 1")
    check("pipeline_parallel_size", lambda v: v.is_integer() and v >= 1, "an integer >= 1")
    check("max_model_len", lambda v: v.is_integer() and v >= 1, "an integer >= 1, or empty", True)
    check("max_num_batched_tokens", lambda v: v.is_integer() and v >= 1,
          "an integer >= 1, or empty", True)  # fmt: skip
    check("max_num_seqs", lambda v: v.is_integer() and v >= 1, "an integer >= 1, or empty", True)
    check("max_cudagraph_capture_size", lambda v: v.is_integer() and v >= 1,
          "an integer >= 1, or empty", True)  # fmt: skip
    check("gpu_memory_utilization", lambda v: 0 < v <= 1, "a number in (0, 1], or empty", True)
    if str(settings.get("port")) == str(settings.get("master_port")):
        errors.append(
            f"vllm_serve_port and vllm_serve_master_port are both {settings.get('port')}; "
            "allowed: two different ports"
        )
    if not str(settings.get("served_model_name") or "").strip():
        errors.append("vllm_serve_served_model_name is empty; allowed: the name clients use")
    return errors


def auth_errors(key_set, hardware, allow_unauthenticated, port) -> list[str]:
    """The endpoint's key rule: on real Sparks (``spark_hardware``) the endpoint needs a key,
    unless the inventory serves without one on purpose (``vllm_serve_allow_unauthenticated``).
    Only whether a key is set comes in: the key itself never reaches a message."""
    if key_set is True or hardware is not True or allow_unauthenticated is True:
        return []
    return [
        f"vllm_serve_api_key is empty, so anyone who reaches port {port} could use the model; "
        "allowed: a key, kept in a vault (ansible-vault encrypt_string --name "
        "vllm_serve_api_key ...), or vllm_serve_allow_unauthenticated: true to serve without one"
    ]


def check_extra_args(extra_args) -> None:
    """Refuse extra arguments that are not strings or that repeat a flag the role manages."""
    if not isinstance(extra_args, (list, tuple)):
        raise ServeConfigError(
            f"vllm_serve_extra_args must be a list of strings, got {type(extra_args).__name__}"
        )
    for arg in extra_args:
        if not isinstance(arg, (str, int, float)) or isinstance(arg, bool):
            raise ServeConfigError(
                f"vllm_serve_extra_args must hold strings, got {arg!r} ({type(arg).__name__})"
            )
        flag = str(arg).split("=", 1)[0]
        if flag in MANAGED_FLAGS:
            raise ServeConfigError(
                f"vllm_serve_extra_args repeats {flag}, which the role sets itself: "
                f"set {MANAGED_FLAGS[flag]} instead"
            )


def _flag(args: list[str], name: str, value) -> None:
    if value is None or value == "" or value is False:
        return
    if value is True:
        args.append(f"--{name}")
    else:
        args.extend([f"--{name}", str(value)])


def serve_args(
    settings: dict, *, backend: str, node_rank: int, nnodes: int, master_addr: str
) -> list:
    """Arguments after ``vllm serve`` for the node of rank ``node_rank`` (0 is the head)."""
    if backend not in BACKENDS:
        raise ServeConfigError(
            f"vllm_serve_backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
        )
    if not 0 <= node_rank < nnodes:
        raise ServeConfigError(f"node rank {node_rank} is outside 0..{nnodes - 1}")
    model = settings.get("model_path") or ""
    if not model:
        raise ServeConfigError("vllm_serve_model_path must name the model directory on every node")
    check_extra_args(settings.get("extra_args") or [])
    if backend == "ray" and node_rank != 0:
        return []

    args = [model]
    _flag(args, "tensor-parallel-size", settings.get("tensor_parallel_size"))
    if int(settings.get("pipeline_parallel_size") or 1) > 1:
        _flag(args, "pipeline-parallel-size", settings["pipeline_parallel_size"])
    if backend == "ray":
        _flag(args, "distributed-executor-backend", "ray")
    else:
        _flag(args, "nnodes", nnodes)
        _flag(args, "node-rank", node_rank)
        _flag(args, "master-addr", master_addr)
        _flag(args, "master-port", settings.get("master_port"))
    # Engine settings: every rank must agree on them.
    _flag(args, "max-model-len", settings.get("max_model_len"))
    _flag(args, "gpu-memory-utilization", settings.get("gpu_memory_utilization"))
    _flag(args, "max-num-batched-tokens", settings.get("max_num_batched_tokens"))
    # Each sequence count up to the capture size gets a CUDA graph at start: both bound the
    # capture (empty leaves vLLM's defaults, 256 and a size derived from it).
    _flag(args, "max-num-seqs", settings.get("max_num_seqs"))
    _flag(args, "max-cudagraph-capture-size", settings.get("max_cudagraph_capture_size"))
    # "auto" is vLLM's own default: no flag (the role resolves its own "auto" before).
    if settings.get("load_format") not in (None, "", "auto"):
        _flag(args, "load-format", settings["load_format"])
    _flag(args, "enable-prefix-caching", bool(settings.get("enable_prefix_caching")))
    _flag(args, "language-model-only", bool(settings.get("language_model_only")))
    # "auto" is vLLM's own default (the model's data type): no flag.
    if settings.get("kv_cache_dtype") not in (None, "", "auto"):
        _flag(args, "kv-cache-dtype", settings["kv_cache_dtype"])
    speculative = settings.get("speculative_config") or {}
    if speculative:
        compact = json.dumps(speculative, sort_keys=True, separators=(",", ":"))
        _flag(args, "speculative-config", compact)
    args.extend(str(a) for a in settings.get("extra_args") or [])
    if node_rank > 0:
        # A headless worker serves no API: the API settings below are the head's.
        args.append("--headless")
        return args
    _flag(args, "served-model-name", settings.get("served_model_name"))
    _flag(args, "host", settings.get("host"))
    _flag(args, "port", settings.get("port"))
    _flag(args, "reasoning-parser", settings.get("reasoning_parser"))
    _flag(args, "enable-auto-tool-choice", bool(settings.get("enable_auto_tool_choice")))
    _flag(args, "tool-call-parser", settings.get("tool_call_parser"))
    kwargs = settings.get("chat_template_kwargs") or {}
    if kwargs:
        _flag(
            args,
            "default-chat-template-kwargs",
            json.dumps(kwargs, sort_keys=True, separators=(",", ":")),
        )
    for middleware in settings.get("middleware") or []:
        _flag(args, "middleware", middleware)
    return args


def serve_env(
    settings: dict, *, backend: str, ray_address: str, token_path: str, rpc_dir: str
) -> dict:
    """Environment of the serving container beyond the communication file from host_prep.
    ``rpc_dir``: where the driver and the head's rank (in the Ray container) share their
    ZeroMQ sockets, inside both containers (spark_ray_rpc_dir_in_container)."""
    env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    if backend == "ray":
        env.update(
            {
                "RAY_ADDRESS": ray_address,
                "RAY_AUTH_MODE": "token",
                "RAY_AUTH_TOKEN_PATH": token_path,
                # The driver's rank on the head runs in the Ray container: its IPC sockets
                # must be in a directory both containers mount.
                "VLLM_RPC_BASE_PATH": rpc_dir,
            }
        )
    env.update({str(k): str(v) for k, v in (settings.get("env") or {}).items()})
    return env


def check_parallel_sizes(
    tensor_parallel_size: int, pipeline_parallel_size: int, gpus: dict
) -> None:
    """TP x PP must use exactly the GPUs the inventory declares across the nodes."""
    total = sum(int(v) for v in gpus.values())
    wanted = int(tensor_parallel_size) * int(pipeline_parallel_size)
    if wanted != total:
        per_node = ", ".join(f"{h}={n}" for h, n in sorted(gpus.items()))
        raise ServeConfigError(
            f"vllm_serve_tensor_parallel_size ({tensor_parallel_size}) x "
            f"vllm_serve_pipeline_parallel_size ({pipeline_parallel_size}) = {wanted} must equal "
            f"the GPUs across the nodes, {total} ({per_node}; spark_gpus per node)"
        )
