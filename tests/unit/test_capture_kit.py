"""The capture kit's map (tests/unit/support/capture_kit.py): each capture names a fixture, the
parser the unit tests hand it to and the role that runs the tool; the kit runs each tool as that
role does; and each capture reads through its parser as the fixture does.

The captures read are the fixtures themselves (the stand-ins for captures not made yet), or,
with ``DGX_SPARK_CAPTURES`` naming an unpacked archive of ``playbooks/capture.yml``, its files:

    tar -xzf dgx-spark-capture-<stamp>.tar.gz
    DGX_SPARK_CAPTURES=dgx-spark-capture-<stamp> .venv/bin/pytest -q tests/unit/test_capture_kit.py
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path

import pytest
import yaml
from support.capture_kit import CAPTURES, CONTEXT, Capture, parse, parser
from support.captures import FIXTURES, provenance_errors, tool_output

ROOT = Path(__file__).resolve().parents[2]
KIT = ROOT / "roles/operate/tasks"
KIT_FILES = ("capture.yml", "capture_benchmarks.yml", "capture_write.yml")
# The kit's archive from the simulated pair (unpacked), read like an owner's: what a CPU node
# without the Spark's tools gives (meminfo, the images, the start log; the rest recorded absent).
SIM_CAPTURE = ROOT / "tests/unit/captures/sim"
ARCHIVE = os.environ.get("DGX_SPARK_CAPTURES", "")
ARCHIVES = [None, SIM_CAPTURE, *([Path(ARCHIVE)] if ARCHIVE else [])]
IDS = [f"{c.name}->{Path(c.fixture).name}" for c in CAPTURES]


def _tasks(path: Path) -> list[dict]:
    """Every task of a task file, those inside blocks too."""
    found = []
    for task in yaml.safe_load(path.read_text()) or []:
        for part in ("block", "rescue", "always"):
            found += [t for t in task.get(part, []) if "block" not in t]
        found.append(task)
    return found


def _task(path: Path, name: str) -> dict:
    (task,) = [t for t in _tasks(path) if t.get("name") == name]
    return task


def _normal(value) -> str:
    """A task's arguments with each role's private prefix taken off, so the kit's and the
    role's read alike where they run the same thing."""
    return re.sub(r"_(?:host_prep|operate_capture)_", "_", json.dumps(value, sort_keys=True))


# --------------------------------------------------------------------------- the map


@pytest.mark.parametrize("capture", CAPTURES, ids=IDS)
def test_each_capture_names_a_fixture_a_parser_and_the_test_that_reads_it(capture: Capture):
    fixture = FIXTURES / capture.fixture
    assert fixture.is_file(), capture.fixture
    assert callable(parser(capture)), capture.parser
    test = ROOT / capture.test
    assert fixture.name in test.read_text(), f"{capture.test} does not read {fixture.name}"
    module = capture.parser.split(".")[0]
    assert f"module_utils import {module}" in test.read_text() or f" {module}" in test.read_text()
    tool = capture.command.split()[0]
    assert tool in (ROOT / capture.runs_in).read_text(), f"{capture.runs_in} does not run {tool}"


def test_the_map_and_the_kit_name_the_same_files():
    """Each file the kit writes (its names, and the patterns it records when a tool is held
    back) is a capture of the map, and each capture of the map is written by the kit."""
    text = "\n".join((KIT / name).read_text() for name in KIT_FILES)
    # A literal name, or a name built from literals and values: the values become '*'.
    built = re.findall(r"'file': ('[^']*'(?: ~ [^,]+?)*),", text)
    written = {"*".join(re.findall(r"'([^']*)'", value)) for value in built}
    patterns = {c.name for c in CAPTURES}
    for name in written:
        assert any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(p, name) for p in patterns), name
    for pattern in patterns:
        assert any(fnmatch.fnmatch(name, pattern) for name in written), pattern
    assert {"ethtool_*.txt", "ib_write_bw_*_to_*.txt", "ib_write_bw_server_*.txt"} <= written


def test_a_context_file_is_no_capture():
    assert not [c for c in CAPTURES for n in CONTEXT if fnmatch.fnmatch(n, c.name)]


# --------------------------------------------------------------------------- as the roles run them

HOST_PREP = ROOT / "roles/host_prep/tasks"


@pytest.mark.parametrize(
    ("role_file", "role_task", "kit_task"),
    [
        ("host_prep/tasks/validate.yml",
         "List the RoCE devices and the ConnectX-7 netdevs behind them on hardware",
         "List the RoCE devices and the netdevs behind them"),
        ("host_prep/tasks/validate.yml", "List the GPUs and their driver on hardware",
         "List the GPUs and their driver"),
        ("vllm_serve/tasks/memory.yml", "Ask the driver what memory each GPU process holds",
         "Ask the driver what memory each GPU process holds"),
    ],
)  # fmt: skip
def test_the_kit_asks_the_tools_what_the_roles_ask(role_file, role_task, kit_task):
    role = _task(ROOT / "roles" / role_file, role_task)["ansible.builtin.command"]
    kit = _task(KIT / "capture.yml", kit_task)["ansible.builtin.command"]
    assert kit == role


def test_ethtool_reads_each_netdev_as_root_as_host_prep_does():
    role = _task(HOST_PREP / "verify.yml", "Read each twin's link settings")
    kit = _task(KIT / "capture.yml", "Read each netdev's link settings")
    assert role["ansible.builtin.command"]["argv"][0] == kit["ansible.builtin.command"]["argv"][0]
    assert role["become"] is kit["become"] is True


@pytest.mark.parametrize(
    ("role_task", "kit_task", "key"),
    [
        ("Plan the RDMA measurement", "Plan the RDMA capture as host_prep plans its measurement",
         "_host_prep_rdma_args"),
        ("Start an ib_write_bw server per twin on the peers",
         "Start an ib_write_bw server per twin on the peers", "ansible.builtin.command"),
        ("Measure RDMA write bandwidth to each peer over each twin",
         "Measure RDMA write bandwidth to each peer over each twin", "ansible.builtin.command"),
    ],
)  # fmt: skip
def test_ib_write_bw_runs_as_host_prep_runs_it(role_task, kit_task, key):
    role = _task(HOST_PREP / "verify_rdma.yml", role_task)
    kit = _task(KIT / "capture_benchmarks.yml", kit_task)
    if key.startswith("_host_prep"):
        role, kit = role["ansible.builtin.set_fact"], kit["ansible.builtin.set_fact"]
        key_kit = key.replace("_host_prep_", "_operate_capture_")
        assert _normal(kit[key_kit]) == _normal(role[key])
        return
    assert _normal(kit[key]) == _normal(role[key])
    assert kit["become"] is role["become"] is True


def test_the_nccl_check_runs_in_the_container_host_prep_starts():
    name = "Start the NCCL all_gather on every node"
    role = dict(
        _task(HOST_PREP / "verify_nccl_torch.yml", name)["community.docker.docker_container"]
    )
    kit = dict(_task(KIT / "capture_benchmarks.yml", name)["community.docker.docker_container"])
    assert (role.pop("name"), kit.pop("name")) == ("dgx-spark-nccl-check", "dgx-spark-nccl-capture")
    assert kit == role


def test_all_gather_perf_runs_as_host_prep_runs_it():
    role = _task(HOST_PREP / "verify_nccl_nccl_tests.yml", "Run all_gather_perf across the nodes")
    kit = _task(KIT / "capture_benchmarks.yml", "Capture all_gather_perf through mpirun")
    tail = "[host_prep_nccl_tests_binary, '-b', _size, '-e', _size, '-f', '2', '-g', '1']"
    for task in (role, kit):
        assert tail in task["ansible.builtin.command"]["argv"]
        assert task["become_user"] == "{{ host_prep_user }}" and task["run_once"] is True
        assert "'NCCL_DEBUG': 'INFO', 'NCCL_DEBUG_SUBSYS': 'INIT,NET'" in task["environment"]


def test_the_kit_changes_nothing_it_does_not_take_back():
    """Every task that may write on a node is one of the benchmarks' (a container removed when
    it ends, async job records removed after): the rest reads. The archive's writes are the
    controller's, and skipped in check mode."""
    writers = {
        f"ansible.builtin.{name}"
        for name in (
            "copy",
            "file",
            "template",
            "tempfile",
            "shell",
            "apt",
            "package",
            "lineinfile",
        )
    } | {"community.docker.docker_image_pull", "community.docker.docker_image_load"}
    for name in KIT_FILES:
        for task in _tasks(KIT / name):
            if writers & set(task):
                assert name == "capture_write.yml", task["name"]
    write = yaml.safe_load((KIT / "capture_write.yml").read_text())
    on_controller = [t for t in write if t.get("delegate_to") == "localhost"]
    assert on_controller and all(t["when"] == "not ansible_check_mode" for t in on_controller)
    container = _task(KIT / "capture_benchmarks.yml", "Start the NCCL all_gather on every node")
    assert container["community.docker.docker_container"]["cleanup"] is True
    cleanups = [t for t in _tasks(KIT / "capture_benchmarks.yml")
                if t.get("ansible.builtin.async_status", {}).get("mode") == "cleanup"]  # fmt: skip
    assert len(cleanups) == 2


# --------------------------------------------------------------------------- through the parsers


def _sources(capture: Capture, archive: Path | None) -> list[Path]:
    """The files to read for ``capture``: the archive's, else the fixture it stands for."""
    if archive is None:
        return [FIXTURES / capture.fixture]
    return sorted(
        path
        for path in archive.glob("*/*")
        if path.is_file() and fnmatch.fnmatch(path.name, capture.name)
    )


def _why_none(capture: Capture, archive: Path) -> str:
    """What the archive's captures.json say of a capture it does not hold."""
    said = {}
    for listed in sorted(archive.glob("*/captures.json")):
        for entry in json.loads(listed.read_text())["files"]:
            if fnmatch.fnmatch(entry["file"], capture.name) or fnmatch.fnmatch(
                capture.name, entry["file"]
            ):
                said.setdefault(f"{entry['status']}: {entry['reason']}", listed.parent.name)
    return "; ".join(f"{node}: {words}" for words, node in said.items()) or "not in the archive"


@pytest.mark.parametrize("archive", ARCHIVES, ids=lambda a: "fixtures" if a is None else a.name)
@pytest.mark.parametrize("capture", CAPTURES, ids=IDS)
def test_each_capture_reads_through_the_parser_of_its_fixture(capture: Capture, archive):
    sources = _sources(capture, archive)
    if not sources:
        pytest.skip(f"{archive}: no {capture.name} ({_why_none(capture, archive)})")
    for path in sources:
        assert provenance_errors(path) == [], path
        parsed = parse(capture, tool_output(path))
        assert capture.shows is None or capture.shows(parsed), f"{path}: {parsed!r:.300}"


@pytest.mark.parametrize("archive", ARCHIVES[1:], ids=lambda a: a.name)
def test_the_archive_holds_a_folder_per_node_with_its_list(archive):
    nodes = [p for p in archive.iterdir() if p.is_dir()]
    assert nodes, f"{archive}: no node folder"
    for node in nodes:
        listed = json.loads((node / "captures.json").read_text())
        assert listed["node"] == node.name
        written = {e["file"] for e in listed["files"] if e["status"] == "captured"}
        assert written == {p.name for p in node.iterdir()} - set(CONTEXT)


def test_the_sims_capture_names_the_fixtures_its_files_would_replace():
    """What the simulated pair's capture holds, and which reconstructed fixture each of its
    files stands beside: a Spark's capture replaces those (and the ones the sim cannot give)."""
    replaces = {}
    for capture in CAPTURES:
        for path in _sources(capture, SIM_CAPTURE):
            replaces.setdefault(f"{path.parent.name}/{path.name}", set()).add(capture.fixture)
    assert replaces == {
        "spark-1/meminfo.txt": {"vllm_serve/meminfo_spark_idle.txt"},
        "spark-2/meminfo.txt": {"vllm_serve/meminfo_spark_idle.txt"},
        # The start log, and NCCL's transport lines where NCCL_DEBUG was on (none on the sim).
        "spark-1/vllm_start.log": {
            "vllm_serve/start_spark_gpu_reconstructed.log",
            "host_prep/nccl_debug_spark_ibext.txt",
        },
    }
    absent = {
        entry["file"]
        for listed in SIM_CAPTURE.glob("*/captures.json")
        for entry in json.loads(listed.read_text())["files"]
        if entry["status"] == "absent"
    }
    assert {"ibdev2netdev.txt", "nvidia_smi_gpus.txt"} <= absent, absent
