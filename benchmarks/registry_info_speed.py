#!/usr/bin/env python3
"""How long dgx_spark.cluster.vllm_registry_info takes in static and in import mode.

For each image it runs one playbook on one node of an inventory (the simulated pair by
default): a warm-up of each mode, then ``--repeat`` timed runs of each, plus as many
``ansible.builtin.ping`` tasks to measure what any task costs (SSH, module transfer). Task
times come from the json callback. Prints, per image, the median static and import times,
their ratio, and the same with the ping floor taken off (the module's own time).

Usage: registry_info_speed.py [--host spark-1] [--inventory inventories/sim]
                              [--repeat 3] [IMAGE ...]
With no IMAGE, the inventory's hybrid_image_base and hybrid_image_donor are measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
MODULE = "dgx_spark.cluster.vllm_registry_info"
ARCHITECTURES = ["Qwen3_5MoeForConditionalGeneration", "Qwen3MoeForCausalLM"]


def default_images(inventory: Path) -> list[str]:
    cluster = yaml.safe_load((inventory / "group_vars" / "all" / "cluster.yml").read_text())
    return [cluster["hybrid_image_base"], cluster["hybrid_image_donor"]]


def task(name: str, mode: str | None, image: str) -> dict:
    if mode is None:
        return {"name": name, "ansible.builtin.ping": {}}
    return {
        "name": name,
        MODULE: {"image": image, "mode": mode, "architectures": ARCHITECTURES},
        "become": True,
    }


def playbook(host: str, images: list[str], repeat: int) -> list[dict]:
    tasks = []
    for image in images:
        for mode in ("static", "import"):
            tasks.append(task(f"warm-up|{mode}|{image}", mode, image))
        for i in range(repeat):
            for mode in ("static", "import", None):
                tasks.append(task(f"timed|{mode or 'ping'}|{image}|{i}", mode, image))
    return [
        {"name": "Time vllm_registry_info", "hosts": host, "gather_facts": False, "tasks": tasks}
    ]


def seconds(duration: dict) -> float:
    start, end = (
        datetime.fromisoformat(duration[k].replace("Z", "+00:00")) for k in ("start", "end")
    )
    return (end - start).total_seconds()


def run(
    host: str, inventory: Path, images: list[str], repeat: int
) -> dict[tuple[str, str], list[float]]:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
    }
    with tempfile.TemporaryDirectory() as tmp:
        book = Path(tmp) / "speed.yml"
        book.write_text(yaml.safe_dump(playbook(host, images, repeat), sort_keys=False))
        cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(book)]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, check=False)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        rc = proc.returncode
        sys.exit(f"ansible-playbook printed no JSON (rc {rc}):\n{proc.stdout}\n{proc.stderr}")
    times: dict[tuple[str, str], list[float]] = {}
    for entry in report["plays"][0]["tasks"]:
        name = entry["task"]["name"]
        result = entry["hosts"][host]
        if result.get("failed") or result.get("unreachable"):
            sys.exit(f"{name} failed on {host}: {result.get('msg')}")
        kind, mode, image = name.split("|")[:3]
        times.setdefault((image, f"{kind}:{mode}"), []).append(seconds(entry["task"]["duration"]))
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="*")
    parser.add_argument("--host", default="spark-1")
    parser.add_argument("--inventory", type=Path, default=ROOT / "inventories" / "sim")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    images = args.images or default_images(args.inventory)
    times = run(args.host, args.inventory, images, args.repeat)
    print(f"{MODULE} on {args.host}, median of {args.repeat} after one warm-up (seconds)")
    header = (
        f"{'image':32} {'static':>7} {'import':>7} {'ratio':>6} {'ping':>6} {'static-ping':>12} "
    )
    print(header + f"{'import-ping':>12} {'ratio':>6} {'cold static':>12} {'cold import':>12}")
    for image in images:
        med = {
            k: statistics.median(times[(image, f"timed:{k}")]) for k in ("static", "import", "ping")
        }
        own_static, own_import = med["static"] - med["ping"], med["import"] - med["ping"]
        print(
            f"{image:32} {med['static']:7.2f} {med['import']:7.2f} "
            f"{med['import'] / med['static']:6.1f} {med['ping']:6.2f} {own_static:12.2f} "
            f"{own_import:12.2f} {own_import / own_static:6.1f} "
            f"{times[(image, 'warm-up:static')][0]:12.2f} "
            f"{times[(image, 'warm-up:import')][0]:12.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
