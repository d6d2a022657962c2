"""The host_prep role's own files (argument_specs against defaults: test_argument_specs.py):
the templates render what a Spark needs, and the NCCL check script refuses unbounded buffers."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import jinja2
import pytest
import yaml

ROLE = Path(__file__).resolve().parents[3] / "roles" / "host_prep"


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
    assert checks.DEFAULT_MIN_BUSBW_GBPS == 21.875


def test_script_combines_rank_transports(script):
    assert script.combine_transports(["IB", "IB"]) == "IB"
    assert script.combine_transports(["IB", "Socket"]) == "Socket"
    assert script.combine_transports(["P2P", "P2P"]) == "P2P"
    assert script.combine_transports(["IB", "unknown"]) == "mixed:IB,unknown"
