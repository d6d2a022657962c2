"""The host_prep role's own files (argument_specs against defaults: test_argument_specs.py):
the templates render what a Spark needs, and the NCCL check script refuses unbounded buffers."""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import jinja2
import pytest
import yaml
from support.captures import tool_output

ROLE = Path(__file__).resolve().parents[3] / "roles" / "host_prep"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "host_prep"


def _render(name: str, **context) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROLE / "templates"))
    return env.get_template(name).render(ansible_managed="Ansible managed", **context)


TWINS = [
    {"netdev": "enp1s0f1np1", "address": "198.51.100.11/24"},
    {"netdev": "enP2p1s0f1np1", "address": "198.51.101.11/24"},
]


def test_netplan_template_for_the_twins():
    text = _render("40-cx7.yaml.j2", inventory_hostname="spark-1", host_prep_mtu=9000,
                   _host_prep_links=TWINS)  # fmt: skip
    assert yaml.safe_load(text) == {
        "network": {
            "version": 2,
            "ethernets": {
                twin["netdev"]: {
                    "dhcp4": False,
                    "dhcp6": False,
                    "link-local": [],
                    "mtu": 9000,
                    "addresses": [twin["address"]],
                }
                for twin in TWINS
            },
        }
    }


def test_comm_env_template_is_key_value_lines():
    env = {"VLLM_HOST_IP": "198.51.100.11", "NCCL_IB_HCA": "rocep1s0f1,roceP2p1s0f1"}
    text = _render("comm.env.j2", inventory_hostname="spark-1", host_prep_comm_env=env)
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines == ["VLLM_HOST_IP=198.51.100.11", "NCCL_IB_HCA=rocep1s0f1,roceP2p1s0f1"]


@pytest.fixture(scope="module")
def script():
    path = ROLE / "files" / "nccl_allgather_busbw.py"
    spec = importlib.util.spec_from_file_location("nccl_allgather_busbw", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("text", "size"),
    [("4G", 4 << 30), ("4GiB", 4 << 30), ("512M", 512 << 20), ("1024K", 1 << 20), ("4096", 4096),
     ("1.5G", 3 << 29)],
)  # fmt: skip
def test_script_sizes(script, text, size):
    assert script.parse_size(text) == size


def test_script_refuses_an_unbounded_buffer(script, capsys):
    with pytest.raises(SystemExit):
        script.arguments(["--size", "16G"])
    assert "has frozen a Spark" in capsys.readouterr().err
    assert script.arguments(["--size", "8G"]).size == 8 << 30
    assert script.arguments([]).size == 1 << 30


def test_script_finds_link_checks_in_the_checkout(script):
    checks = script.load_link_checks()
    assert (checks.DEFAULT_BUSBW_FLOOR_GBPS, checks.DEFAULT_HEALTHY_BUSBW_GBPS) == (6.0, 21.875)


def test_the_node_gets_every_file_the_nccl_check_imports(script):
    """The role copies the script and link_checks.py, nothing else, and the script imports that
    file alone by path in a container without Ansible: it must need only the standard library
    and hold every name the script (and the sim's stand-in rank) takes from it; the re-run
    planning is link_plan.py's."""
    tasks = yaml.safe_load((ROLE / "tasks" / "verify_nccl_torch.yml").read_text())
    copies = [t["ansible.builtin.copy"] for t in tasks if "ansible.builtin.copy" in t]
    assert [Path(copy["dest"]).name for copy in copies] == ["nccl_allgather_busbw.py",
                                                            "link_checks.py"]  # fmt: skip
    assert copies[0]["src"] == "nccl_allgather_busbw.py"
    assert "module_utils_source', 'link_checks')" in copies[1]["content"]
    source = ROLE.parents[1] / "plugins" / "module_utils" / "link_checks.py"
    tree = ast.parse(source.read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}  # fmt: skip
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}  # fmt: skip
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported
    used = set(re.findall(r"\bchecks\.([A-Za-z_]\w*)", (ROLE / "files" / "nccl_allgather_busbw.py")
                          .read_text()))  # fmt: skip
    # The sim's stand-in rank (tests/sim/host_prep_standins) imports the same file from /checks.
    standin = ROLE.parents[1] / "tests" / "sim" / "host_prep_standins" / "nccl_rank.py"
    used |= set(re.findall(r"\blink_checks\.(?!py\b)([A-Za-z_]\w*)", standin.read_text()))
    checks = script.load_link_checks()
    assert used and [name for name in sorted(used) if not hasattr(checks, name)] == []


def test_script_combines_rank_transports(script):
    assert script.combine_transports(["IB", "IB"]) == "IB"
    assert script.combine_transports(["IB", "Socket"]) == "Socket"
    assert script.combine_transports(["P2P", "P2P"]) == "P2P"
    assert script.combine_transports(["IB", "unknown"]) == "mixed:IB,unknown"


@pytest.mark.parametrize(
    ("size", "world", "elem", "expected"),
    [
        (1 << 30, 2, 4, (1 << 27, 1 << 30, "")),
        (1001, 2, 4, (125, 1000, "")),  # rounded down to whole elements per rank
        (7, 2, 4, (0, 0, "--size 7 is too small for 2 ranks of float32")),
    ],
)
def test_script_buffer_layout(script, size, world, elem, expected):
    assert script.buffer_layout(size, world, elem, "float32") == expected


def test_script_takes_at_most_half_the_free_memory(script):
    assert script.memory_refusal(0, 4 << 30, 2, 12 << 30) == ""
    refusal = script.memory_refusal(1, 4 << 30, 2, 11 << 30)
    assert refusal.startswith(f"rank 1: the buffers need {6 << 30} bytes but only {11 << 30}")


def test_script_merges_every_ranks_transport(script):
    mine = {"transport": "IB", "ib_devices": ["rocep1s0f1:1"], "channel_devices": ["rocep1s0f1"]}
    other = {"transport": "IB", "ib_devices": ["roceP2p1s0f1:1"],
             "channel_devices": ["roceP2p1s0f1"]}  # fmt: skip
    gathered = [{"host": "spark-1", "transport": mine}, {"host": "spark-2", "transport": other}]
    hosts, per_rank, merged = script.merge_rank_transports(mine, gathered)
    assert (hosts, per_rank) == (["spark-1", "spark-2"], ["IB", "IB"])
    assert merged["ib_devices"] == ["rocep1s0f1:1", "roceP2p1s0f1:1"]
    assert merged["channel_devices"] == ["rocep1s0f1", "roceP2p1s0f1"]
    assert mine["ib_devices"] == ["rocep1s0f1:1"]  # the rank's own record is left as it was


@pytest.mark.parametrize(
    ("mode", "hosts", "backend", "expected"),
    [
        ("auto", ["spark-1", "spark-2"], "nccl", True),
        ("auto", ["spark-1"], "nccl", False),
        ("yes", ["spark-1"], "nccl", True),
        ("no", ["spark-1", "spark-2"], "nccl", False),
        ("yes", ["spark-1", "spark-2"], "gloo", False),
    ],
)
def test_script_requires_ib_across_hosts(script, mode, hosts, backend, expected):
    assert script.needs_ib(mode, hosts, backend) is expected


def _spark_rank(checks, rank_host: str) -> dict:
    """This rank's transport record, read from one Spark's lines of a published NCCL log
    (tests/unit/fixtures/host_prep/all_gather_perf_spark_ib.txt)."""
    log = tool_output(FIXTURES / "all_gather_perf_spark_ib.txt")
    return checks.nccl_transport(
        "\n".join(line for line in log.splitlines() if line.startswith(rank_host))
    )


def test_script_bandwidths_and_decision(script):
    algbw, busbw = script.bandwidths(4 << 30, 0.1, 2)
    assert (round(algbw, 3), round(busbw, 3)) == (42.95, 21.475)
    args = script.arguments(["--size", "4G"])
    checks = script.load_link_checks()
    local = _spark_rank(checks, "spark-4440")
    run = {"merged": dict(local), "local": local, "wrong": 0}
    hca = "rocep1s0f1,roceP2p1s0f1"
    assert script.decide(checks, args, 24.0, run, True, hca)["passed"] is True
    decision = script.decide(checks, args, 24.0, {**run, "wrong": 3}, True, hca)
    assert decision["passed"] is False
    assert decision["reasons"] == ["3 wrong values after all_gather (data corruption)"]
    assert decision["message"].endswith(": FAIL: 3 wrong values after all_gather (data corruption)")


def test_script_decides_on_its_own_ranks_devices(script):
    checks = script.load_link_checks()
    args = script.arguments(["--size", "4G"])
    local = _spark_rank(checks, "spark-4440")
    # Every rank's transport is IB; the other rank (as if) ran its channels on rocep1s0f0.
    merged = {**local, "ib_devices": local["ib_devices"] + ["rocep1s0f0:1"]}
    run = {"merged": merged, "local": local, "wrong": 0}
    assert script.decide(checks, args, 24.0, run, True, "rocep1s0f1,roceP2p1s0f1")["passed"]
    decision = script.decide(checks, args, 24.0, run, True, "roce_eth0")
    assert decision["reasons"] == [
        "NCCL used NET/IB on rocep1s0f1, roceP2p1s0f1, but NCCL_IB_HCA in comm.env names roce_eth0"
    ]
    # No NCCL_IB_HCA in the container: the transport alone decides, as before.
    assert script.decide(checks, args, 24.0, run, True, None)["passed"]


def test_script_report_line(script):
    args = script.arguments(["--size", "1M", "--iters", "2"])
    merged = {"transport": "gloo", "ib_devices": []}
    run = {"rank": 0, "world": 2, "hosts": ["vm"], "backend": "gloo", "size": 1 << 20,
           "count": 1 << 17, "elapsed": 0.00123456, "algbw": 0.8494, "busbw": 0.4247,
           "wrong": 0, "per_rank": ["gloo", "gloo"], "merged": merged}  # fmt: skip
    decision = {"passed": False, "message": "m", "reasons": ["r"], "percent_of_reference": 1.7}
    environ = {"NCCL_IB_DISABLE": "1", "HOME": "/root"}
    versions = {"nccl": None, "torch": "2.13.0"}
    run["local"] = merged
    line = script.report_line(args, run, decision, versions, environ)
    assert line["time_us"] == 1234.6 and line["busbw_gbps"] == 0.425
    assert line["nccl_local"] == merged
    assert line["env"] == {"NCCL_IB_DISABLE": "1"}
    assert line["decision"] == {"passed": False, "message": "m", "reasons": ["r"]}
    assert (line["iters"], line["warmup"]) == (2, 5)
    assert (line["transport"], line["nccl"]) == ("gloo", merged)


def test_the_link_check_phase_alone_derives_the_comm_environment_it_reads():
    """`--tags host_prep_verify` alone: verify.yml reads host_prep_comm_env, which comm_env.yml
    (the host_prep_network phase) sets; its derivation must carry the verify phase's tag too,
    or that run fails on an undefined variable."""
    verify = "\n".join(p.read_text() for p in ROLE.glob("tasks/verify*.yml"))
    assert "host_prep_comm_env" in verify
    tasks = yaml.safe_load((ROLE / "tasks/comm_env.yml").read_text())
    (derive,) = [t for t in tasks if "host_prep_comm_env" in t.get("ansible.builtin.set_fact", {})]
    assert "host_prep_verify" in derive.get("tags", []), derive
