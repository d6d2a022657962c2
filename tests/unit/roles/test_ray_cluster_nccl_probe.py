"""ray_cluster's NCCL probe (files/nccl_probe.py), run here as tasks/nccl_choice.yml runs it in
the serving image: ``python3 -c <probe> <elf_notes.py's text> [<the node's libnccl>]``.

The image is stood in for by a site-packages directory on PYTHONPATH holding what a CUDA image
holds: a pip NCCL wheel (its metadata and a libnccl.so.2, a hand-written ELF file with a build
ID) and a torch package. The stand-in torch reports NCCL 2.28.9 and maps the wheel's file into
the process as the real one's libtorch_cuda does, or fails to import as a CPU build's NCCL
query does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support.elf import build_id_note, write_elf

ROOT = Path(__file__).resolve().parents[3]
PROBE = ROOT / "roles/ray_cluster/files/nccl_probe.py"
ELF_NOTES = ROOT / "plugins/module_utils/elf_notes.py"
MARK = "dgx-spark-nccl: "
PIP_BUILD = bytes.fromhex("a7f420a1") + bytes(16)
DGX_OS_BUILD = bytes.fromhex("c0db9360") + bytes(16)

TORCH_MAPS_NCCL = """\
import mmap, os, types
_here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_file = open(os.path.join(_here, "nvidia", "nccl", "lib", "libnccl.so.2"), "rb")
_map = mmap.mmap(_file.fileno(), 0, access=mmap.ACCESS_READ)
cuda = types.SimpleNamespace(nccl=types.SimpleNamespace(version=lambda: (2, 28, 9)))
"""
TORCH_WITHOUT_NCCL = "raise ImportError('stand-in for a CPU build')\n"


def image(tmp_path: Path, torch: str, wheel: bool = True) -> Path:
    site = tmp_path / "image" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(torch)
    if wheel:
        info = site / "nvidia_nccl_cu13-2.28.9.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: nvidia-nccl-cu13\nVersion: 2.28.9\n"
        )
        lib = site / "nvidia" / "nccl" / "lib"
        lib.mkdir(parents=True)
        write_elf(lib / "libnccl.so.2", [(build_id_note(PIP_BUILD), 4)], padding=100_000)
    return site


def probe(site: Path, *node: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", PROBE.read_text(), ELF_NOTES.read_text(), *node],
        capture_output=True, text=True, check=True, env=env, timeout=60,
    )  # fmt: skip
    (line,) = [line for line in out.stdout.splitlines() if line.startswith(MARK)]
    return json.loads(line.removeprefix(MARK))


def test_the_build_is_the_file_torch_maps(tmp_path):
    site = image(tmp_path, TORCH_MAPS_NCCL)
    answer = probe(site)
    wheel_lib = str(site / "nvidia/nccl/lib/libnccl.so.2")
    assert answer["version"] == "2.28.9"
    library = answer["library"]
    assert (library["path"], library["how"]) == (wheel_lib, "mapped by torch")
    assert library["build_id"] == PIP_BUILD.hex()
    assert library["size"] == Path(wheel_lib).stat().st_size
    assert wheel_lib in answer["files"] and answer["node"] is None


def test_without_nccl_in_torch_the_wheel_stands_in(tmp_path):
    site = image(tmp_path, TORCH_WITHOUT_NCCL)
    answer = probe(site)
    assert answer["version"] == "2.28.9 (the nvidia-nccl-cu13 wheel; torch has none)"
    assert answer["library"]["how"] == "a pip wheel's libnccl.so.2 (torch maps none)"
    assert answer["library"]["build_id"] == PIP_BUILD.hex()


def test_the_nodes_library_is_read_where_it_is_mounted(tmp_path):
    node = write_elf(tmp_path / "libnccl.so.2.28.9", [(build_id_note(DGX_OS_BUILD), 4)])
    answer = probe(image(tmp_path, TORCH_MAPS_NCCL), str(node))
    assert answer["node"]["build_id"] == DGX_OS_BUILD.hex()
    assert answer["node"]["size"] == node.stat().st_size


@pytest.mark.skipif(
    any(Path("/usr/lib").glob("*/libnccl.so*")), reason="this machine has a system libnccl"
)
def test_an_image_without_nccl_says_so(tmp_path):
    answer = probe(image(tmp_path, TORCH_WITHOUT_NCCL, wheel=False))
    assert answer["version"] == "none in torch (ImportError: a CPU build has no NCCL)"
    assert answer["library"] is None and answer["files"] == []


def test_the_choice_runs_this_probe_with_the_reader_and_the_nodes_file():
    tasks = yaml.safe_load((ROOT / "roles/ray_cluster/tasks/nccl_choice.yml").read_text())
    (task,) = [t for t in tasks if t.get("name", "").startswith("Ask the serving image")]
    entrypoint = task["community.docker.docker_container"]["entrypoint"]
    assert entrypoint[:2] == ["python3", "-c"]
    assert "lookup('ansible.builtin.file', 'nccl_probe.py')" in entrypoint[2]
    assert "lookup('dgx_spark.cluster.module_utils_source', 'elf_notes')" in entrypoint[3]
    assert "_ray_cluster_nccl_node_in_probe" in entrypoint[4]
