"""Tests for plugins/module_utils/twin_definitions.py: other netplan files and NetworkManager
profiles that define the ConnectX-7 twins, refused before host_prep applies its own file.

The files are constructed examples (tests/unit/fixtures/host_prep/netplan_*.txt and nm_*.txt,
described in its README); the listing the role's find command prints is made from them here,
as find and base64 print it."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import twin_definitions as td
from support.captures import tool_output

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "host_prep"
NETPLAN_DIRS = ["/run/netplan", "/etc/netplan", "/lib/netplan"]
NM_DIR = "/etc/NetworkManager/system-connections"
OWN = "/etc/netplan/40-cx7.yaml"
# spark-1's twins of QSFP port 1 as twins_from_facts gives them (the MACs the fixtures name).
TWIN_1 = {"netdev": "enp1s0f1np1", "address": "198.51.100.11/24",
          "macs": ["4c:bb:47:2a:10:01"], "driver": "mlx5_core"}  # fmt: skip
TWIN_2 = {"netdev": "enP2p1s0f1np1", "address": "198.51.101.11/24",
          "macs": ["4c:bb:47:2a:10:03"], "driver": "mlx5_core"}  # fmt: skip
TWINS = [TWIN_1, TWIN_2]


def fixture(name: str) -> str:
    return tool_output(FIXTURES / name)


def listed(path: str, text: str | None, uid: int = 0, mode: str = "600") -> str:
    """One file as the role's find prints it: owner, mode and path, then base64 on one line
    (no such line when base64 could not read the file)."""
    head = f"{uid} {mode} {path}\n"
    if text is None:
        return head
    return head + base64.b64encode(text.encode()).decode() + "\n"


def judge(*files: str, stderr: str = "", rc: int = 0, twins=None, own: str = OWN) -> dict:
    listing = {"stdout": "".join(files), "stderr": stderr, "rc": rc}
    return td.leftover_definitions(
        listing, TWINS if twins is None else twins, own, "spark-1", NETPLAN_DIRS, [NM_DIR]
    )


# --------------------------------------------------------------------------- netplan files


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # Both twins by their names, an earlier setup's addresses at MTU 9000.
        ("netplan_hand_written_twins.txt", [
            ("enp1s0f1np1", "ethernets.enp1s0f1np1",
             ["addresses 192.168.100.10/24", "dhcp4 false", "mtu 9000"]),
            ("enP2p1s0f1np1", "ethernets.enP2p1s0f1np1",
             ["addresses 192.168.200.10/24", "dhcp4 false", "mtu 9000"]),
        ]),
        # A name pattern that takes every wired port, the twins among them.
        ("netplan_glob_dhcp.txt", [
            ("enp1s0f1np1", "ethernets.all-wired, match name en*", ["dhcp4 true", "dhcp6 true"]),
            ("enP2p1s0f1np1", "ethernets.all-wired, match name en*", ["dhcp4 true", "dhcp6 true"]),
        ]),
        # The first twin by its MAC address only, renamed, under NetworkManager at MTU 1500.
        ("netplan_mac_match.txt", [
            ("enp1s0f1np1", "ethernets.cx7-a, match macaddress 4c:bb:47:2a:10:01",
             ["addresses 10.10.10.1/24", "mtu 1500", "renderer NetworkManager",
              "set-name enp1s0f1np1"]),
        ]),
        # What NetworkManager's netplan integration writes for an nmcli profile.
        ("netplan_nm_profile_twin.txt", [
            ("enP2p1s0f1np1",
             "ethernets.NM-3f1a8d2e-6b7c-4e0a-9c55-2d1e8f4b7a10, match name enP2p1s0f1np1",
             ["addresses 192.168.200.10/24", "mtu 9000", "renderer NetworkManager",
              "also networkmanager, wakeonlan"]),
        ]),
        # Files that define no twin.
        ("netplan_network_manager_all.txt", []),
        ("netplan_management_only.txt", []),
    ],
)  # fmt: skip
def test_netplan_files_define_the_twins_they_name(name, expected):
    found = td.netplan_definitions(td.load_netplan(fixture(name)), TWINS)
    assert [(f["twin"], f["how"], f["sets"]) for f in found] == expected


def test_a_mac_in_digits_alone_stays_a_mac_address():
    # YAML 1.1 reads 12:34:56:07:08:09 as a sexagesimal number; netplan reads a string.
    text = fixture("netplan_mac_match.txt").replace("4c:bb:47:2a:10:01", "12:34:56:07:08:09")
    twin = {**TWIN_1, "macs": ["12:34:56:07:08:09"]}
    (hit,) = td.netplan_definitions(td.load_netplan(text.replace('"', "")), [twin])
    assert hit["how"] == "ethernets.cx7-a, match macaddress 12:34:56:07:08:09"


@pytest.mark.parametrize(
    ("match", "twin", "hits"),
    [
        ({"name": "enp1s0f1np1"}, TWIN_1, True),
        ({"name": "enp1s0f0np0"}, TWIN_1, False),
        ({"name": "enP2*"}, TWIN_2, True),
        ({"macaddress": "4C:BB:47:2A:10:03"}, TWIN_2, True),
        ({"macaddress": "4c:bb:47:2a:10:03"}, TWIN_1, False),
        ({"driver": "mlx5_*"}, TWIN_1, True),
        ({"driver": ["ixgbe", "mlx5_core"]}, TWIN_1, True),
        ({"driver": "mlx5_core"}, {**TWIN_1, "driver": ""}, False),  # no driver in the facts
        # netplan ANDs the conditions of one match block.
        ({"name": "en*", "macaddress": "4c:bb:47:2a:10:03"}, TWIN_1, False),
        ({"name": "en*", "macaddress": "4c:bb:47:2a:10:03"}, TWIN_2, True),
        # A block with nothing this module can judge matches nothing.
        ({"pci-path": "x"}, TWIN_1, False),
    ],
)
def test_netplan_match_blocks(match, twin, hits):
    network = {"ethernets": {"some-id": {"match": match, "mtu": "1500"}}}
    assert bool(td.netplan_definitions(network, [twin])) is hits


def test_a_bond_or_bridge_that_takes_a_twin_counts_too():
    network = td.load_netplan(
        "network:\n  ethernets:\n    cx7:\n      match: {name: enp1s0f1np1}\n"
        "  bonds:\n    bond0:\n      interfaces: [cx7, enP2p1s0f1np1]\n"
        "      addresses: [10.30.0.1/24]\n"
    )
    found = [(f["twin"], f["entry"]) for f in td.netplan_definitions(network, TWINS)]
    assert found == [
        ("enp1s0f1np1", "ethernets.cx7"),
        ("enp1s0f1np1", "bonds.bond0"),
        ("enP2p1s0f1np1", "bonds.bond0"),
    ]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("network:\n  ethernets: [\n", "not YAML that netplan can read"),
        ("- just\n- a list\n", "its top level is not a mapping"),
        ("network: {}\n---\nnetwork: {}\n", "not YAML that netplan can read"),
    ],
)
def test_a_file_netplan_cannot_read_is_refused_by_name(text, words):
    with pytest.raises(td.DefinitionError, match=words):
        td.load_netplan(text)
    got = judge(listed("/etc/netplan/99-broken.yaml", text))
    assert not got["passed"]
    (error,) = got["errors"]
    assert error.startswith("spark-1: /etc/netplan/99-broken.yaml is ") and words in error
    assert error.endswith("netplan would refuse it too. Fix or remove it, then run again")


def test_an_empty_netplan_file_defines_nothing():
    assert td.load_netplan("") == {} and td.load_netplan("# only a comment\n") == {}
    assert judge(listed("/etc/netplan/10-empty.yaml", ""))["passed"]


# --------------------------------------------------------------------------- NetworkManager


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("nm_twin_manual.txt", [
            ("enp1s0f1np1", "interface-name=enp1s0f1np1",
             ["ipv4.method manual", "ipv4 addresses 192.168.100.10/24", "ipv6.method disabled",
              "mtu 1500"]),
        ]),
        ("nm_twin_by_mac_dhcp.txt", [
            ("enP2p1s0f1np1", "mac-address=4c:bb:47:2a:10:03",
             ["ipv4.method auto (DHCP)", "ipv6.method auto"]),
        ]),
        # en*f1np1 takes both twins of port 1; !*np0 would refuse port 0's.
        ("nm_match_glob.txt", [
            ("enp1s0f1np1", "[match] interface-name=en*f1np1;!*np0",
             ["ipv4.method manual", "ipv4 addresses 10.20.0.1/24"]),
            ("enP2p1s0f1np1", "[match] interface-name=en*f1np1;!*np0",
             ["ipv4.method manual", "ipv4 addresses 10.20.0.1/24"]),
        ]),
        # A Wi-Fi profile, and the management port's.
        ("nm_wifi.txt", []),
        ("nm_management.txt", []),
    ],
)  # fmt: skip
def test_profiles_bind_the_twins_they_name(name, expected):
    found = td.keyfile_definitions(td.parse_keyfile(fixture(name)), TWINS)
    assert [(f["twin"], f["how"], f["sets"]) for f in found] == expected


def test_a_profile_must_match_every_binding_it_names():
    profile = td.parse_keyfile(fixture("nm_twin_manual.txt"))
    # The interface name of the first twin with the MAC address of the second: no device.
    profile["ethernet"]["mac-address"] = "4c:bb:47:2a:10:03"
    assert td.keyfile_definitions(profile, TWINS) == []
    # The older byte-list form of the first twin's MAC.
    profile["ethernet"]["mac-address"] = "76;187;71;42;16;1;"
    assert [f["twin"] for f in td.keyfile_definitions(profile, TWINS)] == ["enp1s0f1np1"]


def test_a_profile_bound_to_no_interface_is_not_judged():
    profile = td.parse_keyfile(fixture("nm_twin_manual.txt"))
    del profile["connection"]["interface-name"]
    assert td.keyfile_definitions(profile, TWINS) == []


@pytest.mark.parametrize(
    ("patterns", "netdev", "hits"),
    [
        (["enp1s0f1np1"], "enp1s0f1np1", True),
        (["eth*", "enp1s0f1*"], "enp1s0f1np1", True),  # optional: one is enough
        (["eth*", "wl*"], "enp1s0f1np1", False),
        (["en*", "!*np0"], "enp1s0f0np0", False),  # !x alone is mandatory
        (["en*", "|!*np0"], "enp1s0f0np0", True),  # |!x stays optional
        (["&en*", "&*np1"], "enP2p1s0f1np1", True),
        (["&en*", "&*np1"], "enP2p1s0f0np0", False),
        (["\\!odd"], "!odd", True),  # a backslash escapes a leading !
    ],
)
def test_nm_match_interface_name(patterns, netdev, hits):
    assert td.nm_match_names(patterns, netdev) is hits


@pytest.mark.parametrize(
    ("name", "uid", "mode", "why"),
    [
        ("cx7.nmconnection", 0, 0o600, ""),
        ("Wired connection 2", 0, 0o600, ""),  # no extension needed in /etc
        ("cx7.nmconnection", 0, 0o644, "mode 0644"),
        ("cx7.nmconnection", 1000, 0o600, "owned by uid 1000"),
        (".cx7.nmconnection.swp", 0, 0o600, "hidden, backup or temporary"),
        ("cx7.nmconnection~", 0, 0o600, "hidden, backup or temporary"),
        ("cx7.nmconnection.Ab12Cd", 0, 0o600, "hidden, backup or temporary"),
        ("ca.pem", 0, 0o600, "a certificate or key"),
    ],
)
def test_keyfiles_networkmanager_does_not_load(name, uid, mode, why):
    got = td.nm_ignores(f"{NM_DIR}/{name}", uid, mode)
    assert (why in got) if why else got == ""


# --------------------------------------------------------------------------- the decision


def test_a_node_with_only_host_prep_s_file_and_unrelated_ones_passes():
    got = judge(
        listed(OWN, "network:\n  ethernets:\n    enp1s0f1np1: {mtu: 9000}\n"),
        listed("/etc/netplan/01-network-manager-all.yaml",
               fixture("netplan_network_manager_all.txt")),
        listed(f"{NM_DIR}/office.nmconnection", fixture("nm_wifi.txt")),
        listed(f"{NM_DIR}/cx7-twin-1.nmconnection", fixture("nm_twin_manual.txt"), mode="644"),
        stderr="find: '/run/netplan': No such file or directory\n"
        "find: '/lib/netplan': No such file or directory\n",
        rc=1,
    )  # fmt: skip
    assert got["passed"] and got["errors"] == [] and got["found"] == []
    assert got["read"] == [
        "/etc/netplan/01-network-manager-all.yaml",
        f"{NM_DIR}/office.nmconnection",
    ]
    assert got["message"] == (
        "spark-1: no other netplan file or NetworkManager profile defines enp1s0f1np1, "
        "enP2p1s0f1np1 (read: /etc/netplan/01-network-manager-all.yaml, "
        f"{NM_DIR}/office.nmconnection; NetworkManager loads none of "
        f"{NM_DIR}/cx7-twin-1.nmconnection (mode 0644 (NetworkManager loads only files that "
        "root alone can read)))"
    )


def test_each_leftover_file_is_refused_once_with_its_twins_and_the_fix():
    got = judge(
        listed(OWN, "network: {}\n"),
        listed("/etc/netplan/60-cx7-link.yaml", fixture("netplan_hand_written_twins.txt")),
        listed(f"{NM_DIR}/Wired connection 2.nmconnection", fixture("nm_twin_by_mac_dhcp.txt")),
    )
    assert not got["passed"]
    assert [(f["file"], f["twin"]) for f in got["found"]] == [
        ("/etc/netplan/60-cx7-link.yaml", "enp1s0f1np1"),
        ("/etc/netplan/60-cx7-link.yaml", "enP2p1s0f1np1"),
        (f"{NM_DIR}/Wired connection 2.nmconnection", "enP2p1s0f1np1"),
    ]
    netplan, nm = got["errors"]
    assert netplan == (
        "spark-1: /etc/netplan/60-cx7-link.yaml also defines twin enp1s0f1np1 "
        "(ethernets.enp1s0f1np1): addresses 192.168.100.10/24, dhcp4 false, mtu 9000; twin "
        "enP2p1s0f1np1 (ethernets.enP2p1s0f1np1): addresses 192.168.200.10/24, dhcp4 false, "
        "mtu 9000. netplan merges every file in /run/netplan, /etc/netplan, /lib/netplan with "
        "host_prep's /etc/netplan/40-cx7.yaml, so the twin would get a second address, another "
        "MTU or another renderer. Move the file out of those directories (sudo mv "
        "/etc/netplan/60-cx7-link.yaml /root/), or remove ethernets.enp1s0f1np1, "
        "ethernets.enP2p1s0f1np1 from it, then run again"
    )
    assert nm == (
        f"spark-1: NetworkManager profile {NM_DIR}/Wired connection 2.nmconnection ('Wired "
        "connection 2') binds twin enP2p1s0f1np1 (mac-address=4c:bb:47:2a:10:03): ipv4.method "
        "auto (DHCP), ipv6.method auto. NetworkManager can activate it on the twin beside "
        "host_prep's netplan file. Delete it (sudo nmcli connection delete "
        f"0b8f2f64-93d1-4a8e-b0f4-5b1d6f0c7e22), or move it out of {NM_DIR} and run sudo nmcli "
        "connection reload, then run again"
    )
    assert got["message"] == "\n".join(got["errors"])


def test_a_file_host_prep_wrote_under_another_name_is_named_as_such():
    ours = "# ConnectX-7 twins of spark-1: static addresses\n" + fixture(
        "netplan_hand_written_twins.txt"
    )
    (error,) = judge(listed("/etc/netplan/41-standin.yaml", ours))["errors"]
    assert error.endswith("(it carries this collection's heading: an earlier "
                          "host_prep_netplan_file left it)")  # fmt: skip


@pytest.mark.parametrize("first_run", [False, True], ids=["host_prep's file there", "first run"])
@pytest.mark.parametrize(
    ("path", "refused"),
    [
        # /run/netplan comes first: a file there with host_prep's name replaces host_prep's.
        ("/run/netplan/40-cx7.yaml", True),
        # /lib/netplan comes last: host_prep's file replaces it, also before it is written.
        ("/lib/netplan/40-cx7.yaml", False),
    ],
)
def test_a_file_of_host_prep_s_name_elsewhere(path, refused, first_run):
    own = "" if first_run else listed(OWN, "network: {}\n")
    got = judge(own, listed(path, fixture("netplan_hand_written_twins.txt")))
    assert got["passed"] is not refused
    if refused:
        assert got["errors"] == [
            f"spark-1: {path} has the name of host_prep's {OWN} in a directory netplan prefers, "
            f"so netplan reads it instead of host_prep's file. Remove it (sudo rm {path}), then "
            "run again"
        ]


def test_a_shadowed_leftover_is_not_read_and_the_one_that_wins_is():
    etc = listed("/etc/netplan/60-cx7-link.yaml", fixture("netplan_hand_written_twins.txt"))
    lib = listed("/lib/netplan/60-cx7-link.yaml", fixture("netplan_glob_dhcp.txt"))
    got = judge(lib, etc)
    assert {f["file"] for f in got["found"]} == {"/etc/netplan/60-cx7-link.yaml"}
    assert "/lib/netplan/60-cx7-link.yaml" not in got["read"]


def test_only_yaml_files_count_in_netplan_s_directories():
    # host_prep keeps the owner's replaced file as 40-cx7.yaml.dgx-spark-previous.
    kept = listed(f"{OWN}.dgx-spark-previous", fixture("netplan_hand_written_twins.txt"))
    assert judge(kept)["passed"]


def test_an_unreadable_file_and_a_failed_listing_refuse():
    unreadable = judge(
        listed("/etc/netplan/60-cx7-link.yaml", None),
        stderr="base64: /etc/netplan/60-cx7-link.yaml: Permission denied\n",
        rc=1,
    )
    assert unreadable["errors"] == [
        "spark-1: find said: base64: /etc/netplan/60-cx7-link.yaml: Permission denied",
        "spark-1: /etc/netplan/60-cx7-link.yaml could not be read: host_prep cannot tell whether "
        "it defines a twin",
    ]
    # No find on the node: nothing listed proves nothing.
    (missing,) = judge(stderr="", rc=127)["errors"]
    assert missing.startswith("spark-1: listing the netplan files and NetworkManager profiles "
                              "failed (rc 127: no message)")  # fmt: skip
    (garbled,) = judge("not a listing line\n")["errors"]
    assert "not a line of the listing: 'not a listing line'" in garbled


def test_the_listing_keeps_each_file_its_content():
    text = listed("/etc/netplan/a b.yaml", "x: 1\n") + listed("/etc/netplan/empty.yaml", "")
    missing = (
        "find: '/run/netplan': No such file or directory\n"  # LC_ALL=C, as the role runs it
        "find: \u2018/lib/netplan\u2019: No such file or directory\n"  # a UTF-8 locale
        "find: `/etc/NetworkManager/system-connections': No such file or directory\n"  # older
    )
    got = td.parse_listing(text, missing + "find: '/etc/netplan': Permission denied\n")
    assert got == {
        "files": [
            {"path": "/etc/netplan/a b.yaml", "uid": 0, "mode": 0o600, "text": "x: 1\n"},
            {"path": "/etc/netplan/empty.yaml", "uid": 0, "mode": 0o600, "text": ""},
        ],
        "problems": ["find: '/etc/netplan': Permission denied"],
    }


def test_the_twins_come_from_the_links_and_the_facts():
    # ansible_facts as setup gathers them on a Spark (interface names with '-' or '.' in their
    # fact key as '_'); the sim's capture has no MAC, so these are written here.
    facts = {
        "ansible_enp1s0f1np1": {"macaddress": "4C:BB:47:2A:10:01", "module": "mlx5_core"},
        "enP2p1s0f1np1": {
            "macaddress": "4c:bb:47:2a:10:03",
            "perm_macaddress": "4c:bb:47:2a:10:0f",
        },
    }
    links = [{"netdev": "enp1s0f1np1", "address": "198.51.100.11/24"},
             {"netdev": "enP2p1s0f1np1", "address": "198.51.101.11/24"},
             {"netdev": "eth0", "address": "172.30.241.11/24"}]  # fmt: skip
    assert td.twins_from_facts(links, facts) == [
        {"netdev": "enp1s0f1np1", "address": "198.51.100.11/24",
         "macs": ["4c:bb:47:2a:10:01"], "driver": "mlx5_core"},
        {"netdev": "enP2p1s0f1np1", "address": "198.51.101.11/24",
         "macs": ["4c:bb:47:2a:10:03", "4c:bb:47:2a:10:0f"], "driver": ""},
        {"netdev": "eth0", "address": "172.30.241.11/24", "macs": [], "driver": ""},
    ]  # fmt: skip


def test_the_heading_is_the_one_host_prep_s_template_writes():
    template = Path(__file__).resolve().parents[4] / "roles/host_prep/templates/40-cx7.yaml.j2"
    assert any(line.startswith(td.OWN_HEADING) for line in template.read_text().splitlines())
