"""operate's tasks/ranks.yml reads the build of each libnccl the ranks map (status and the
benchmark name it beside the version): its one-line reader run here on a hand-written ELF file as
it runs in the Ray container, then the task that keeps each node's answers and the benchmark's
line, run as they are in their files on given results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from support.elf import build_id_note, write_elf

ROOT = Path(__file__).resolve().parents[3]
RANKS = yaml.safe_load((ROOT / "roles/operate/tasks/ranks.yml").read_text())
BENCHMARK = yaml.safe_load((ROOT / "roles/operate/tasks/benchmark.yml").read_text())
READ = "Read the build of each libnccl the ranks load"
KEEP = "Keep what each node's ranks run"
SHOW = "Show what the ranks run"
WHEEL = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
IN = "/opt/dgx-spark-nccl/libnccl.so.2"
HOST_REAL = "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"
PIP_ID = "a7f420a1" + "5e" * 16  # the public reports' first eight hex digits; the rest made up


def task(tasks: list[dict], name: str) -> dict:
    return next(t for t in tasks if t.get("name") == name)


def test_the_reader_gives_each_paths_build(tmp_path):
    reader = task(RANKS, READ)["vars"]["_operate_build_reader"]
    lib = write_elf(tmp_path / "libnccl.so.2", [(build_id_note(bytes.fromhex(PIP_ID)), 4)])
    missing = str(tmp_path / "gone" / "libnccl.so.2")
    out = subprocess.run(
        [sys.executable, "-c", reader, (ROOT / "plugins/module_utils/elf_notes.py").read_text(),
         str(lib), missing],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    builds = json.loads(out.stdout)
    assert builds[str(lib)]["build_id"] == PIP_ID
    assert builds[str(lib)]["size"] == lib.stat().st_size
    assert builds[missing]["error"].startswith("FileNotFoundError")


def results(*items) -> dict:
    return {"results": list(items)}


def test_the_answers_carry_the_builds_and_the_benchmark_line_names_them(tmp_path):
    read = {"rc": 0, "stdout": json.dumps({WHEEL: {"path": WHEEL, "build_id": PIP_ID}})}
    given = {
        "_operate_rank_nodes": ["spark-1", "spark-2"],
        "_operate_rank_ray": results({"container": {"Image": "sha256:1f"}},
                                     {"container": {"Image": "sha256:1f"}}),
        "_operate_rank_maps": results({"stdout_lines": [WHEEL]}, {"stdout_lines": [IN]}),
        "_operate_rank_host_nccl": results(
            {"stat": {"exists": True, "lnk_source": HOST_REAL}},
            {"stat": {"exists": True, "lnk_source": HOST_REAL}}),
        "_operate_rank_report": results({"skipped": True}, {"skipped": True}),
        # spark-2's reader failed (no python3 in its image): its build is simply not known.
        "_operate_rank_builds": results(read, {"rc": 127, "stdout": ""}),
    }  # fmt: skip
    play = [{
        "name": "operate's rank answers on given results",
        "hosts": "localhost",
        "gather_facts": False,
        "vars": given,
        "tasks": [task(RANKS, KEEP), task(BENCHMARK, SHOW),
                  {"name": "Show the answers",
                   "ansible.builtin.debug": {"var": "_operate_ranks"}}],
    }]  # fmt: skip
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json"}  # fmt: skip
    done = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "play.yml"),
         "-i", "localhost,", "-c", "local", "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, env=env, text=True, capture_output=True, check=False, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    shown = {t["task"]["name"]: t["hosts"]["localhost"]
             for t in json.loads(done.stdout)["plays"][0]["tasks"]}  # fmt: skip
    ranks = shown["Show the answers"]["_operate_ranks"]
    assert ranks["spark-1"]["nccl_builds"][WHEEL]["build_id"] == PIP_ID
    assert ranks["spark-2"]["nccl_builds"] == {}
    line = " ".join(shown[SHOW]["msg"].split())
    assert f"libnccl loaded: {WHEEL} (build a7f420a1) (the node has {HOST_REAL})." in line
    assert f"libnccl loaded: {IN} (the node has {HOST_REAL})." in line
