#!/usr/bin/env python3
"""Bad inputs against the serving pair: each refused before any change, with the downtime.

For every bad input, a client asks the endpoint for one token every half second while
``ansible-playbook deploy.yml -i inventories/sim -e ...`` runs; the script prints whether the
run was refused, whether any host changed (the play recap), the endpoint's longest gap
between good answers (its downtime) and the first line of the refusal.

The last entries are refused by the serving image's own vLLM (its argument parser and its
registries of reasoning and tool-call parsers), asked by the serve stage before any container
is touched; they run with ``--tags serve`` (the stages before it have nothing to do with them).
What vLLM can refuse only once it loads the model (a context longer than the model's) is not
here: it is rolled back, and tests/sim/test_serving.py measures that.

Usage: bad_inputs.py [--json PATH] [--only WORDS]...   (the pair must be serving: make demo)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
from drills import SERVE, Client  # noqa: E402

sys.path.insert(0, str(ROOT / "sim"))
import simctl  # noqa: E402

# The sim's own extra arguments, kept where an entry adds one.
SIM_EXTRA_ARGS = list(SERVE["vllm_serve_extra_args"])

# (kind, the extra variables as JSON[, the tags of deploy.yml to run])
BAD_INPUTS = [
    ("port above 65535", {"vllm_serve_port": 70000}),
    ("port 0", {"vllm_serve_port": 0}),
    ("port not a number", {"vllm_serve_port": "http"}),
    ("serving port on Ray's GCS port", {"vllm_serve_port": 6379}),
    ("serving port in Ray's worker range", {"vllm_serve_port": 12000}),
    ("master port equal to the serving port", {"vllm_serve_master_port": 8000}),
    ("negative context length", {"vllm_serve_max_model_len": -5}),
    ("memory fraction above 1", {"vllm_serve_gpu_memory_utilization": 1.5}),
    ("memory fraction 0", {"vllm_serve_gpu_memory_utilization": 0}),
    ("token budget 0", {"vllm_serve_max_num_batched_tokens": 0}),
    ("tensor parallel 0", {"vllm_serve_tensor_parallel_size": 0}),
    ("TP x PP not the GPUs", {"vllm_serve_tensor_parallel_size": 4}),
    ("unknown backend", {"vllm_serve_backend": "grpc"}),
    ("extra args repeat --api-key", {"vllm_serve_extra_args": ["--api-key", "x"]}),
    ("extra args repeat -tp", {"vllm_serve_extra_args": ["-tp", "2"]}),
    ("extra args not a list", {"vllm_serve_extra_args": "--enforce-eager"}),
    ("empty served name", {"vllm_serve_served_model_name": ""}),
    ("empty key on hardware", {"spark_hardware": True, "vllm_serve_api_key": ""}),
    ("Ray port above 65535", {"ray_cluster_gcs_port": 99999}),
    ("Ray ports clash", {"ray_cluster_node_manager_port": 6379}),
    ("Ray worker range reversed", {"ray_cluster_min_worker_port": 20000}),
    ("no GPU for Ray", {"ray_cluster_num_gpus": 0}),
    ("unknown Ray state", {"ray_cluster_state": "paused"}),
    ("fast IP not IPv4", {"spark_fast_ip": "300.1.1.1"}),
    ("unknown serving state", {"vllm_serve_state": "paused"}),
    # Refused by the serving image's vLLM, asked before any container is touched.
    ("unknown reasoning parser", {"vllm_serve_reasoning_parser": "no_such_reasoner"}, ["serve"]),
    ("unknown tool-call parser", {"vllm_serve_enable_auto_tool_choice": True,
                                  "vllm_serve_tool_call_parser": "no_such_tools"}, ["serve"]),
    ("extra arg vLLM cannot parse", {"vllm_serve_extra_args": SIM_EXTRA_ARGS
                                     + ["--max-num-seqs", "abc"]}, ["serve"]),
    ("extra arg vLLM does not know", {"vllm_serve_extra_args": SIM_EXTRA_ARGS
                                      + ["--no-such-flag"]}, ["serve"]),
]  # fmt: skip


def run(extra: dict, tags: list[str] | None = None) -> tuple[int, dict, str, list[str]]:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
    }
    cmd = [str(ROOT / ".venv/bin/ansible-playbook"), "deploy.yml", "-i", "inventories/sim",
           "-e", json.dumps(extra)] + (["--tags", ",".join(tags)] if tags else [])  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, check=False)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return proc.returncode, {}, (proc.stderr.strip().splitlines() or ["no output"])[-1], []
    reason, changed = "", []
    for play in report["plays"]:
        for task in play["tasks"]:
            for host, res in task["hosts"].items():
                if res.get("failed") and not reason:
                    reason = str(res.get("msg", "")).strip().splitlines()[0]
                if res.get("changed"):
                    changed.append(f"{host}: {task['task']['name']}")
    return proc.returncode, report.get("stats", {}), reason, changed


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run the entries whose kind contains these words (repeatable)",
    )
    args = parser.parse_args()
    chosen = [e for e in BAD_INPUTS if not args.only or any(w in e[0] for w in args.only)]
    head = simctl.read_nodes()[0]
    url = f"http://{head.mgmt_ip}:{SERVE.get('vllm_serve_port', 8000)}"
    rows = []
    print(f"{'bad input':40} {'refused':>7} {'changed':>7} {'downtime s':>10} {'run s':>6}  reason",
          flush=True)  # fmt: skip
    for kind, extra, *tags in chosen:
        client = Client(url)
        client.start()
        time.sleep(1.5)
        started = time.monotonic()
        rc, stats, reason, changed_tasks = run(extra, tags[0] if tags else None)
        seconds = time.monotonic() - started
        time.sleep(1.5)
        client.halt.set()
        client.join(timeout=15)
        good = [at for at, ok in client.events if ok]
        gaps = [b - a for a, b in zip(good, good[1:], strict=False)]
        downtime = max(gaps, default=0.0) if len(good) == len(client.events) else max(gaps + [999])
        changed = sum(s.get("changed", 0) for s in stats.values())
        rows.append({"input": kind, "extra": extra, "refused": rc != 0, "changed": changed,
                     "changed_tasks": changed_tasks, "downtime_s": round(downtime, 1),
                     "run_s": round(seconds, 1), "reason": reason})  # fmt: skip
        print(f"{kind:40} {str(rc != 0):>7} {changed:>7} {downtime:>10.1f} {seconds:>6.1f}  "
              f"{reason[:110]}", flush=True)  # fmt: skip
        for task in changed_tasks:
            print(f"{'':40}   changed: {task}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["refused"] and r["changed"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
