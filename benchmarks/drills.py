#!/usr/bin/env python3
"""Fault drills on the simulated pair: how long until it serves again, with no human.

A client asks the endpoint for one token every half second while a fault is made; for each
fault the script prints the time from the fault to the first of three consecutive good
completions (counted only after the fault's own action is complete: a node restart, the 30 s
of a dropped link, the later node's start after a power cut), that time measured from the
end of the fault's action, and how many requests failed meanwhile. Nothing but the fault is done: no
playbook runs, so what comes back is what the pair does by itself (Docker's restart
policies, Ray's membership, vLLM's executor).

Faults (names for --faults):
  cold-start      stop the head's serving container, then start it: one cold vLLM start,
                  the yardstick for the others
  worker-rank     kill -9 the main process of the worker's rank container (Ray backend: the
                  worker's Ray container; multinode: its serving container)
  head-rank       kill -9 the main process of the head's serving container
  rank-freeze     SIGSTOP the worker's rank (Ray backend: its RayWorkerProc actor; multinode:
                  every process of its serving container): every container runs, the pair
                  answers nothing; a watchdog must act
  worker-reboot   restart the worker's node container (its dockerd and every container in it)
  head-reboot     restart the head's node container
  power-cut       kill both node containers, start the head, then the worker
  power-cut-late  kill both, start the worker, then the head 60 s later
  link-drop       take the worker's fast-link interface down for 30 s, then up again (as a
                  pulled cable: the interface keeps its name and address)

Usage: drills.py [--faults a,b,...] [--timeout 600] [--json PATH]
The pair must be serving (make demo; -e vllm_serve_backend=multinode for that backend, which
the script tells from the worker's containers) and keeps serving afterwards unless a fault
was not recovered (then the table says so and the script exits 1).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sim"))
import simctl  # noqa: E402


def module_util(name: str):
    """The collection's ``plugins/module_utils/<name>.py``, loaded by its path (no collection is
    installed where the drills and the sim's tests run)."""
    if name in sys.modules:
        return sys.modules[name]
    path = ROOT / "plugins" / "module_utils" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# The modules' and the watchdog's client of the endpoint; it imports vllm_health (which imports
# vllm_log) by its name.
module_util("vllm_log")
module_util("vllm_health")
vllm_client = module_util("vllm_client")


def urllib_open(url: str, data=None, headers=None, method=None, timeout: float = 30.0):
    """vllm_client's opener outside Ansible: urllib with open_url's arguments."""
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    return urllib.request.urlopen(request, timeout=timeout)  # noqa: S310 (the endpoint's URL)


def endpoint(url: str, key: str = "", timeout: float = 30.0):
    """The collection's client of the endpoint at ``url``, asking with ``key`` (empty: none)."""
    return vllm_client.Client(url, key, timeout, opener=urllib_open)


SERVE = yaml.safe_load((ROOT / "inventories/sim/group_vars/all/serve.yml").read_text())
# The name clients ask for: the served name of the sim's model profile (model.yml there).
_MODEL = yaml.safe_load((ROOT / "inventories/sim/group_vars/all/model.yml").read_text())
SERVED_MODEL = _MODEL["spark_model_profiles"][_MODEL["spark_model_profile"]]["serve"][
    "served_model_name"
]
FAULTS = ("cold-start", "worker-rank", "head-rank", "rank-freeze", "worker-reboot",
          "head-reboot", "power-cut", "power-cut-late", "link-drop")  # fmt: skip


def docker(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["docker", *args], text=True, capture_output=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def on_node(node, *args: str, check: bool = True) -> str:
    return docker("exec", node.container, *args, check=check)


class Client(threading.Thread):
    """One-token completions, one every half second; remembers each answer's time and result."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.events: list[tuple[float, bool]] = []
        self.halt = threading.Event()

    def ask(self) -> bool:
        asked = endpoint(self.url, SERVE["vllm_serve_api_key"], timeout=10)
        return asked.complete(SERVED_MODEL, "spark").ok

    def run(self) -> None:
        while not self.halt.is_set():
            self.events.append((time.monotonic(), self.ask()))
            time.sleep(0.5)

    def recovered_after(self, since: float) -> float | None:
        """Seconds from ``since`` to the first of three consecutive good answers after it."""
        streak = []
        for at, ok in self.events:
            if at < since:
                continue
            streak = [*streak, at] if ok else []
            if len(streak) == 3:
                return streak[0] - since
        return None

    def failed_since(self, since: float) -> int:
        return sum(1 for at, ok in self.events if at >= since and not ok)


def backend(worker) -> str:
    """The deployed backend: with the multinode launcher the worker runs a serving container."""
    running = on_node(worker, "docker", "ps", "-q", "--filter", "name=^dgx-spark-vllm$")
    return "multinode" if running else "ray"


def rank_container(node, head: bool) -> str:
    if head or backend(node) == "multinode":
        return "dgx-spark-vllm"
    return "dgx-spark-ray"


def kill_main_process(node, container: str) -> None:
    pid = on_node(node, "docker", "inspect", "-f", "{{.State.Pid}}", container)
    on_node(node, "kill", "-9", pid)


def fast_interface(node) -> str:
    for line in on_node(node, "ip", "-o", "-4", "addr", "show").splitlines():
        fields = line.split()
        if fields[3].split("/")[0] == node.fast_ip:
            return fields[1]
    raise RuntimeError(f"{node.name}: no interface has {node.fast_ip}")


def wait_node(node) -> None:
    simctl.wait_ready(node)


def make_fault(name: str, head, worker) -> None:
    if name == "cold-start":
        on_node(head, "docker", "stop", "dgx-spark-vllm")
        on_node(head, "docker", "start", "dgx-spark-vllm")
    elif name == "worker-rank":
        kill_main_process(worker, rank_container(worker, head=False))
    elif name == "head-rank":
        kill_main_process(head, "dgx-spark-vllm")
    elif name == "rank-freeze" and backend(worker) == "multinode":
        top = on_node(worker, "docker", "top", "dgx-spark-vllm", "-eo", "pid")
        on_node(worker, "kill", "-STOP", *top.split()[1:])
    elif name == "rank-freeze":
        pid = on_node(worker, "pgrep", "-f", "ray::RayWorkerProc").split()[0]
        on_node(worker, "kill", "-STOP", pid)
    elif name == "worker-reboot":
        docker("restart", worker.container)
    elif name == "head-reboot":
        docker("restart", head.container)
    elif name == "power-cut":
        docker("kill", head.container, worker.container)
        docker("start", head.container)
        docker("start", worker.container)
    elif name == "power-cut-late":
        docker("kill", head.container, worker.container)
        docker("start", worker.container)
        time.sleep(60)
        docker("start", head.container)
    elif name == "link-drop":
        # Not `docker network disconnect`: reconnecting renames the interface (eth0 -> eth2),
        # which no cable does, and the ranks' *_SOCKET_IFNAME would name a missing device.
        link = fast_interface(worker)
        on_node(worker, "ip", "link", "set", "dev", link, "down")
        time.sleep(30)
        on_node(worker, "ip", "link", "set", "dev", link, "up")
    else:
        raise ValueError(f"unknown fault {name!r}; known: {', '.join(FAULTS)}")


def drill(name: str, head, worker, timeout: float) -> dict:
    client = Client(f"http://{head.mgmt_ip}:{SERVE.get('vllm_serve_port', 8000)}")
    client.start()
    try:
        deadline = time.monotonic() + 120
        while client.recovered_after(0) is None:
            if time.monotonic() > deadline:
                return {"fault": name, "recovered": False, "error": "not serving before the fault"}
            time.sleep(1)
        fault_at = time.monotonic()
        make_fault(name, head, worker)
        # Answers during the fault's own action (a node's stop grace period, say) say
        # nothing about recovery: count from the moment the fault is complete.
        done_at = time.monotonic()
        while time.monotonic() - done_at < timeout:
            seconds = client.recovered_after(done_at)
            if seconds is not None:
                return {"fault": name, "recovered": True,
                        "seconds": round(seconds + done_at - fault_at, 1),
                        "after_fault_done": round(seconds, 1),
                        "failed_requests": client.failed_since(fault_at)}  # fmt: skip
            time.sleep(1)
        return {"fault": name, "recovered": False, "seconds": None, "after_fault_done": None,
                "failed_requests": client.failed_since(fault_at)}  # fmt: skip
    finally:
        client.halt.set()
        client.join(timeout=15)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait per fault")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    head, worker = simctl.read_nodes()[:2]
    results = []
    print(f"backend: {backend(worker)}", flush=True)
    header = ("fault", "recovered", "seconds", "after fault", "failed requests")
    print(f"{header[0]:16} {header[1]:>9} {header[2]:>8} {header[3]:>12} {header[4]:>16}",
          flush=True)  # fmt: skip
    for name in [f.strip() for f in args.faults.split(",") if f.strip()]:
        result = drill(name, head, worker, args.timeout)
        results.append(result)
        print(f"{name:16} {str(result['recovered']):>9} {str(result.get('seconds')):>8} "
              f"{str(result.get('after_fault_done')):>12} "
              f"{str(result.get('failed_requests', '-')):>16}", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r["recovered"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
