"""Tests for plugins/module_utils/stamp.py: reading, comparing, the reason line, status."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import stamp as st

NOW = datetime(2026, 12, 6, 13, 0, tzinfo=UTC)
INPUTS = {
    "mtu": 9000,
    "comm_env": "NCCL_IB_HCA=mlx5_0\nNCCL_SOCKET_IFNAME=enp1s0f0np0\n",
    "nccl": {"check": "container", "size_mib": 64},
    "kernel": "6.17.0-1031-nvidia",
}
RESULT = {"rdma_gbps": {"enp1s0f0np0": 96.4}, "nccl_busbw_gbps": 22.1}


def stamped(inputs=INPUTS, result=RESULT, hours=3):
    return st.make("link-check", inputs, result, NOW - timedelta(hours=hours))


def test_make_keeps_the_inputs_themselves():
    stamp = stamped()
    assert stamp == {
        "name": "link-check",
        "inputs": INPUTS,
        "result": RESULT,
        "passed_at": "2026-12-06T10:00:00Z",
        "format": 1,
    }
    assert st.read(json.dumps(stamp)) == stamp


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "{not json",
        "[]",
        json.dumps({**stamped(), "format": 2}),
        json.dumps({k: v for k, v in stamped().items() if k != "passed_at"}),
        json.dumps({**stamped(), "inputs": ["a"]}),
        # an older collection's own record of a check reads as none
        json.dumps({"format": 1, "inputs": INPUTS, "digest": "0" * 16, "checked_at": "x"}),
    ],
)
def test_read_returns_none_for_what_is_no_stamp(text):
    assert st.read(text) is None


@pytest.mark.parametrize("name", ["", "../etc", "a/b", ".hidden", "x y"])
def test_names_are_plain_file_names(name):
    with pytest.raises(ValueError, match="stamp name"):
        st.make(name, {}, {}, NOW)


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (INPUTS, []),
        ({**INPUTS, "mtu": 1500}, ["mtu: 9000 -> 1500"]),
        ({**INPUTS, "nccl": {"check": "container", "size_mib": 128}}, ["nccl.size_mib: 64 -> 128"]),
        (
            {**INPUTS, "comm_env": "NCCL_IB_HCA=mlx5_1\nNCCL_SOCKET_IFNAME=enp1s0f0np0\n"},
            ["comm_env: NCCL_IB_HCA=mlx5_0 -> NCCL_IB_HCA=mlx5_1"],
        ),
        (
            {k: v for k, v in INPUTS.items() if k != "kernel"},
            ["kernel: 6.17.0-1031-nvidia -> (none)"],
        ),
        ({**INPUTS, "peers": ["10.0.0.2"]}, ['peers: (none) -> ["10.0.0.2"]']),
        (
            {**INPUTS, "nccl": {}},
            ["nccl.check: container -> (none)", "nccl.size_mib: 64 -> (none)"],
        ),
        ({**INPUTS, "nccl": None}, ['nccl: {"check": "container", "size_mib": 64} -> (none)']),
        (
            {**INPUTS, "kernel": "x" * 60},
            [f"kernel: 6.17.0-1031-nvidia -> {'x' * 39}…"],
        ),
    ],
)
def test_differences_name_each_changed_input(inputs, expected):
    assert st.differences(stamped(), inputs) == expected


def test_differences_without_a_stamp_are_none():
    assert st.differences(None, INPUTS) == []


@pytest.mark.parametrize(
    ("stamp", "inputs", "line", "valid"),
    [
        (None, INPUTS, "runs: no stamp", False),
        (stamped(), {**INPUTS, "mtu": 1500}, "runs: mtu changed from 9000 to 1500", False),
        (
            stamped(),
            {**INPUTS, "mtu": 1500, "kernel": "7.0"},
            "runs: kernel changed from 6.17.0-1031-nvidia to 7.0; mtu changed from 9000 to 1500",
            False,
        ),
        (
            stamped(),
            INPUTS,
            "skipped: link-check passed 2026-12-06T10:00:00Z (3 h ago) with these inputs: "
            "nccl_busbw_gbps=22.1, rdma_gbps.enp1s0f0np0=96.4",
            True,
        ),
        (
            stamped(inputs={"tree /m": "0" * 16}),
            {"tree /m": st.INCOMPLETE},
            "runs: tree /m could not be read whole",
            False,
        ),
    ],
)
def test_reason_and_check(stamp, inputs, line, valid):
    assert st.reason("link-check", stamp, inputs, NOW) == line
    answer = st.check("link-check", stamp, inputs, NOW)
    assert answer["valid"] is valid and answer["reason"] == line and answer["stamp"] == stamp


@pytest.mark.parametrize(
    ("delta", "said"),
    [
        (timedelta(seconds=5), "just now"),
        (timedelta(minutes=12), "12 min ago"),
        (timedelta(hours=3, minutes=59), "3 h ago"),
        (timedelta(days=2, hours=1), "2 d ago"),
    ],
)
def test_age(delta, said):
    assert st.age((NOW - delta).strftime(st.TIME), NOW) == said


def test_age_of_an_unreadable_time():
    assert st.age("yesterday", NOW) == "at an unknown time"


def test_same_ignores_only_when_it_passed():
    assert st.same(stamped(hours=3), stamped(hours=1))
    assert not st.same(stamped(), stamped(result={"rdma_gbps": 90}))
    assert not st.same(None, stamped())


def test_tree_input():
    tree = {"exists": True, "complete": True, "entries": [["a", 1, 2, None]]}
    assert st.tree_input(tree) == st.tree_input(dict(tree))
    assert st.tree_input(tree) != st.tree_input({**tree, "entries": [["a", 1, 3, None]]})
    assert st.tree_input({"exists": True, "complete": False, "entries": []}) == st.INCOMPLETE


def test_status_lines():
    stamps = {"link-check": stamped(), "collective": None}
    assert st.status_lines(stamps, NOW) == [
        "collective: unreadable (the check runs again)",
        "link-check: passed 2026-12-06T10:00:00Z (3 h ago): nccl_busbw_gbps=22.1, "
        "rdma_gbps.enp1s0f0np0=96.4; inputs: comm_env=NCCL_IB_HCA=mlx5_0\\nNCC…, "
        "kernel=6.17.0-1031-nvidia, mtu=9000, nccl.check=container, nccl.size_mib=64",
    ]


def test_a_whole_document_as_result_is_summed_up_in_one_short_line():
    document = {"text": "x" * 5000, "versions": {f"package{i}": f"{i}.0" for i in range(40)}}
    line = st.summary(document)
    assert len(line) == 160 and line.endswith("…")
    assert line.startswith("text=xxxxxxxxxxxxxxxxxxxxxxx…, versions.package0=0.0, ")


def test_write_load_remove(tmp_path):
    directory = str(tmp_path / "stamps")
    stamp = stamped()
    path = st.write(directory, stamp)
    assert path == os.path.join(directory, "link-check.json")
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(directory).st_mode & 0o777) == "0o700"
    assert os.listdir(directory) == ["link-check.json"]  # no temporary file left
    (tmp_path / "stamps" / "broken.json").write_text("{")
    (tmp_path / "stamps" / "notes.txt").write_text("x")
    assert st.load(directory, "link-check") == stamp
    assert st.load_all(directory) == {"broken": None, "link-check": stamp}
    assert st.remove(directory, "link-check", dry=True) is True
    assert st.load(directory, "link-check") == stamp
    assert st.remove(directory, "link-check") is True
    assert st.remove(directory, "link-check") is False
    assert st.load_all(str(tmp_path / "none")) == {}


def test_an_existing_directory_keeps_its_mode(tmp_path):
    tmp_path.chmod(0o755)
    st.write(str(tmp_path), stamped())
    assert oct(tmp_path.stat().st_mode & 0o777) == "0o755"
