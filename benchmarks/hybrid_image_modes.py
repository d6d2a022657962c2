#!/usr/bin/env python3
"""Build time of the serving image: each_node against build_once + shipping, and reruns.

Runs playbooks/images.yml on an inventory (the simulated pair by default) four times, under
an image name of its own (so the pair's dgx-spark/vllm-serving:current is never touched):

  1. each_node, from no image and without the build cache (hybrid_image_force=true)
  2. each_node again, unchanged inputs
  3. build_once, from no image on any node and without the build cache
  4. build_once again, unchanged inputs

The benchmark's images are removed before runs 1 and 3 and at the end. Task times come from
the json callback. Prints, per run: wall time, the build, import-check and ship times, the
bytes shipped and the number of changed tasks.

On the simulated pair the inventory's base is served as it is (nothing is built): the runs
take the older base, as test_profiles' switch does (--base; empty: the inventory's).

Usage: hybrid_image_modes.py [--inventory inventories/sim] [--name dgx-spark/vllm-serving-bench]
                             [--base vllm-node:0.14.1-ray2.60.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / ".venv" / "bin"
BUILD = "Build the image under its unverified tag"
IMPORT = "Import the wanted architectures in the new image"
SHIP = "Stream the image from the head into this node"
BYTES = "Keep the number of bytes shipped"


def env() -> dict[str, str]:
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
    }


def seconds(duration: dict) -> float:
    start, end = (
        datetime.fromisoformat(duration[k].replace("Z", "+00:00")) for k in ("start", "end")
    )
    return (end - start).total_seconds()


def remove_images(inventory: Path, name: str) -> None:
    """Remove every tag of the benchmark's repository on every node."""
    script = (
        f"docker image ls {name} | awk 'NR > 1 {{print $1 \":\" $2}}'"
        " | xargs -r docker image rm >/dev/null; docker image prune -f"
        " --filter label=dgx_spark.cluster.hybrid_image.digest >/dev/null"
    )
    cmd = [
        str(BIN / "ansible"),
        "sparks",
        "-i",
        str(inventory),
        "-b",
        "-m",
        "ansible.builtin.shell",
    ]
    proc = subprocess.run(
        [*cmd, "-a", script], cwd=ROOT, env=env(), text=True, capture_output=True, check=False
    )
    if proc.returncode != 0:
        sys.exit(f"removing {name} failed:\n{proc.stdout}\n{proc.stderr}")


def run(inventory: Path, extra: dict) -> dict:
    cmd = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        str(ROOT / "playbooks" / "images.yml"),
        "--extra-vars",
        json.dumps(extra),
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env(), text=True, capture_output=True, check=False)
    wall = time.monotonic() - started
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        sys.exit(f"ansible-playbook printed no JSON (rc {proc.returncode}):\n{proc.stderr}")
    if proc.returncode != 0:
        failed = [
            f"{entry['task']['name']} on {host}: {result.get('msg')} {result.get('stderr', '')}"
            for play in report["plays"]
            for entry in play["tasks"]
            for host, result in entry["hosts"].items()
            if result.get("failed")
        ]
        sys.exit(f"images.yml failed (rc {proc.returncode}):\n" + "\n".join(failed))
    out = {"wall": wall, "build": {}, "import": {}, "ship": {}, "bytes": {}, "changed": {}}
    for play in report["plays"]:
        for entry in play["tasks"]:
            name = entry["task"]["name"].split(" : ", 1)[-1]  # without the role's prefix
            for host, result in entry["hosts"].items():
                if result.get("skipped") or result.get("skip_reason"):
                    continue
                if name == BUILD:
                    out["build"][host] = seconds(entry["task"]["duration"])
                elif name == IMPORT:
                    out["import"][host] = seconds(entry["task"]["duration"])
                elif name == SHIP:
                    out["ship"][host] = seconds(entry["task"]["duration"])
                elif name == BYTES:
                    out["bytes"][host] = int(result["ansible_facts"]["_hybrid_image_shipped_bytes"])
    out["changed"] = {host: stats["changed"] for host, stats in report["stats"].items()}
    return out


def fmt(values: dict, unit: str = "s") -> str:
    if not values:
        return "-"
    if unit == "B":
        return ", ".join(f"{h} {v / 1e9:.2f} GB" if v else f"{h} 0" for h, v in values.items())
    return ", ".join(f"{h} {v:.0f}{unit}" for h, v in sorted(values.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", type=Path, default=ROOT / "inventories" / "sim")
    parser.add_argument("--name", default="dgx-spark/vllm-serving-bench")
    parser.add_argument("--base", default="vllm-node:0.14.1-ray2.60.0")
    args = parser.parse_args()
    base = {"hybrid_image_base": args.base} if args.base else {}
    runs = [
        ("each_node, no image, no cache", True, {"hybrid_image_force": True}),
        ("each_node, rerun", False, {}),
        ("build_once, no image, no cache", True, {"hybrid_image_force": True}),
        ("build_once, rerun", False, {}),
    ]
    results = []
    for label, fresh, extra in runs:
        mode = label.split(",")[0]
        if fresh:
            remove_images(args.inventory, args.name)
        print(f"running: {label}", file=sys.stderr, flush=True)
        results.append(
            (
                label,
                run(
                    args.inventory,
                    {"hybrid_image_name": args.name, "hybrid_image_mode": mode, **base, **extra},
                ),
            )
        )
    remove_images(args.inventory, args.name)
    print(f"playbooks/images.yml on {args.inventory.name}, image {args.name}")
    print(f"{'run':32} {'wall':>6}  build | import check | ship | bytes shipped | changed")
    for label, r in results:
        print(
            f"{label:32} {r['wall']:5.0f}s  {fmt(r['build'])} | {fmt(r['import'])} | "
            f"{fmt(r['ship'])} | {fmt(r['bytes'], 'B')} | {fmt(r['changed'], '')}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
