"""tools/cpu_split.py: where the CPU of a playbook run on the sim goes, from the kernel's
per-cgroup counters and /proc/stat."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("cpu_split", ROOT / "tools" / "cpu_split.py")
cpu_split = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_split)

# Captured on the 2-core machine the sim runs on (USER_HZ 100).
PROC_STAT = """\
cpu  3827749 806944 1118407 4213719 27010 0 47285 428243 0 0
cpu0 1913001 403470 559200 2106859 13505 0 23642 214121 0 0
intr 123456 0
"""
# cgroup v2's cpu.stat, as Docker's cgroups have it.
CPU_STAT_V2 = """\
usage_usec 48592356
user_usec 40000000
system_usec 8592356
nr_periods 0
nr_throttled 0
throttled_usec 0
"""
ID_A = "a" * 64
ID_B = "b" * 64


def test_busy_is_user_nice_system_and_interrupts_and_steal_stands_apart():
    busy, steal = cpu_split.proc_stat_seconds(PROC_STAT, 100)
    assert busy == pytest.approx((3827749 + 806944 + 1118407 + 0 + 47285) / 100)
    assert steal == pytest.approx(4282.43)


def test_cgroup_usage_in_either_version():
    assert cpu_split.cgroup_seconds("cpuacct.usage", "48592356436\n") == pytest.approx(48.592356436)
    assert cpu_split.cgroup_seconds("cpu.stat", CPU_STAT_V2) == pytest.approx(48.592356)
    with pytest.raises(ValueError, match="usage_usec"):
        cpu_split.cgroup_seconds("cpu.stat", "nr_periods 0\n")


def test_container_cgroups_are_found_under_each_driver(tmp_path):
    v1 = tmp_path / "cpuacct" / "docker" / ID_A
    v1.mkdir(parents=True)
    (v1 / "cpuacct.usage").write_text("1\n")
    v2 = tmp_path / "system.slice" / f"docker-{ID_B}.scope"
    v2.mkdir(parents=True)
    (v2 / "cpu.stat").write_text(CPU_STAT_V2)
    # Not containers: the docker parent's own file, a slice that is not Docker's.
    (tmp_path / "cpuacct" / "docker" / "cpuacct.usage").write_text("5\n")
    (tmp_path / "system.slice" / "ssh.service").mkdir()
    (tmp_path / "system.slice" / "ssh.service" / "cpu.stat").write_text(CPU_STAT_V2)
    found = cpu_split.cgroup_files(tmp_path)
    assert found == {ID_A: v1 / "cpuacct.usage", ID_B: v2 / "cpu.stat"}


def test_the_controller_is_what_no_container_used():
    before = {"busy": 100.0, "steal": 10.0, ID_A: 50.0, ID_B: 20.0}
    after = {"busy": 330.0, "steal": 65.0, ID_A: 102.0, ID_B: 20.0, "c" * 64: 7.5}
    busy, steal, rows = cpu_split.split(before, after, {ID_A: "dgxsim-spark-1"})
    assert (busy, steal) == (230.0, 55.0)
    # B used nothing: no row. C started in between: counted from zero, shown by its short ID.
    assert rows == [
        ("controller (outside the containers)", 230.0 - 52.0 - 7.5),
        ("dgxsim-spark-1", 52.0),
        ("c" * 12, 7.5),
    ]
