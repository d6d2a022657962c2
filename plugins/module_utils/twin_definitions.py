# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Other definitions of the ConnectX-7 twins on a node, found before host_prep applies its own.

netplan merges every ``*.yaml`` file of /run/netplan, /etc/netplan and /lib/netplan, in the
order of their names; a file shadows a file of the same name in a directory of lower
precedence (/run over /etc over /lib). A twin that another file defines too gets what that
file sets there besides host_prep's file: a second address, another MTU, another renderer.
NetworkManager activates a profile (a keyfile in /etc/NetworkManager/system-connections) on
the device its ``interface-name``, ``mac-address`` or ``[match] interface-name`` names,
beside whatever netplan renders for it.

``leftover_definitions`` judges what ``find`` printed on the node (each file's owner, mode and
path, then its content in base64 on one line: ``parse_listing``). A netplan file defines a twin
under ``ethernets`` by the twin's netdev name or by ``match`` (``name`` glob, ``macaddress``,
``driver``), or takes it into a bond or bridge; a NetworkManager profile of type ethernet binds
it by ``interface-name``, ``mac-address`` or ``[match] interface-name``. Each finding names the
file, the twin, what the file sets and the fix. A profile bound to no interface is not judged.

Pure functions, no I/O; YAML through PyYAML, which the controller's Ansible brings.
"""

from __future__ import annotations

import base64
import binascii
import posixpath
import re
from fnmatch import fnmatchcase

try:
    import yaml
except ImportError:  # only the filter on the controller calls this file, where Ansible has it
    yaml = None

# The heading host_prep's template writes (templates/40-cx7.yaml.j2): a file that carries it
# at another path is one of this collection's own, left by an earlier host_prep_netplan_file.
OWN_HEADING = "# ConnectX-7 twins of "

_HEADER = re.compile(r"^(?P<uid>\d+) (?P<mode>[0-7]{1,4}) (?P<path>/.*)$")
# find's words for a starting point that does not exist (run with LC_ALL=C).
_MISSING = re.compile(r"^find: ['`\u2018](?P<path>.+)['\u2019]: No such file or directory$")
# NetworkManager skips hidden and backup files, mkstemp's temporary files (a dot and six
# letters or digits) and 802.1x certificates and keys in its keyfile directories.
_NM_TEMPORARY = re.compile(r"\.[A-Za-z0-9]{6}$")
_NM_ETHERNET = ("ethernet", "802-3-ethernet")
_NM_ADDRESS_KEY = re.compile(r"^address(?:es)?\d*$")


class DefinitionError(ValueError):
    """A file netplan or NetworkManager would read, but that this module cannot."""


# --------------------------------------------------------------------------- the listing


def parse_listing(stdout: str, stderr: str = "") -> dict:
    """``find -L DIRS -maxdepth 1 -type f -printf '%U %m %p\\n' -exec base64 -w0 {} ;
    -printf '\\n'`` -> ``{"files": [...], "problems": [...]}``.

    Each file is ``{"path", "uid", "mode", "text"}``; ``text`` is None when base64 could not
    read it (then no content line follows its header). ``problems`` are stderr's lines, but
    those for a directory that does not exist (an answer, not a problem).
    """
    files: list[dict] = []
    lines = str(stdout or "").splitlines()
    pos = 0
    while pos < len(lines):
        head = _HEADER.match(lines[pos])
        if head is None:
            raise DefinitionError(f"not a line of the listing: {lines[pos][:80]!r}")
        entry = {
            "path": posixpath.normpath(head["path"]),
            "uid": int(head["uid"]),
            "mode": int(head["mode"], 8),
            "text": None,
        }
        pos += 1
        if pos < len(lines) and _HEADER.match(lines[pos]) is None:
            try:
                entry["text"] = base64.b64decode(lines[pos], validate=True).decode(
                    "utf-8", "replace"
                )
            except (binascii.Error, ValueError):
                raise DefinitionError(f"{entry['path']}: its content is not base64") from None
            pos += 1
        files.append(entry)
    problems = [
        line.strip()
        for line in str(stderr or "").splitlines()
        if line.strip() and not _MISSING.match(line.strip())
    ]
    return {"files": files, "problems": problems}


# --------------------------------------------------------------------------- the twins


def twins_from_facts(links: list[dict], facts: dict) -> list[dict]:
    """The node's resolved links with what names them elsewhere: ``{"netdev", "address",
    "macs" (lower case: the MAC and the permanent one where facts give it), "driver"}``."""
    facts = {str(k).removeprefix("ansible_"): v for k, v in (facts or {}).items()}
    twins = []
    for link in links or []:
        netdev = str(link["netdev"])
        keys = (netdev, netdev.replace("-", "_").replace(":", "_").replace(".", "_"))
        data = next((facts[k] for k in keys if isinstance(facts.get(k), dict)), {})
        macs = {str(data[k]).lower() for k in ("macaddress", "perm_macaddress") if data.get(k)}
        twins.append(
            {
                "netdev": netdev,
                "address": str(link.get("address", "")),
                "macs": sorted(macs),
                "driver": str(data.get("module") or ""),
            }
        )
    return twins


# --------------------------------------------------------------------------- netplan


def load_netplan(text: str) -> dict:
    """A netplan file's ``network`` mapping ({} when it has none), every scalar a string as
    netplan reads them (``12:34:56:07:08:09`` stays a MAC address, not a number)."""
    if yaml is None:
        raise DefinitionError("reading netplan files needs PyYAML on the controller")
    try:
        # BaseLoader builds only strings, lists and mappings: nothing a file could run.
        doc = yaml.load(text, Loader=yaml.BaseLoader)
    except yaml.YAMLError as exc:
        raise DefinitionError(
            "not YAML that netplan can read (" + " ".join(str(exc).split())[:160] + ")"
        ) from None
    if doc in (None, ""):
        return {}
    if not isinstance(doc, dict):
        raise DefinitionError("not a netplan file: its top level is not a mapping")
    network = doc.get("network")
    return network if isinstance(network, dict) else {}


def _listed(value: object) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    return [] if value in (None, "") else [str(value)]


def _netplan_match(match: dict, twin: dict) -> bool:
    """Every condition of a ``match`` block holds for the twin (netplan ANDs them); a block
    with none that can be judged here matches nothing."""
    judged = False
    if "name" in match:
        judged = True
        if not fnmatchcase(twin["netdev"], str(match["name"])):
            return False
    if "macaddress" in match:
        judged = True
        if str(match["macaddress"]).lower() not in twin["macs"]:
            return False
    if "driver" in match:
        judged = True
        drivers = _listed(match["driver"])
        if not twin["driver"] or not any(fnmatchcase(twin["driver"], d) for d in drivers):
            return False
    return judged


def _addresses(value: object) -> list[str]:
    """netplan's ``addresses``: plain ``IP/prefix`` items or one-key mappings with options."""
    out = []
    for item in value if isinstance(value, list) else []:
        out.extend(item.keys() if isinstance(item, dict) else [str(item)])
    return out


def _netplan_sets(entry: dict, renderer: str) -> list[str]:
    parts = []
    shown = {"match", "set-name", "addresses", "dhcp4", "dhcp6", "mtu", "link-local", "renderer"}
    if _addresses(entry.get("addresses")):
        parts.append("addresses " + ", ".join(_addresses(entry.get("addresses"))))
    for key in ("dhcp4", "dhcp6", "mtu"):
        if key in entry:
            parts.append(f"{key} {entry[key]}")
    if "link-local" in entry:
        parts.append("link-local [" + ", ".join(_listed(entry["link-local"])) + "]")
    if entry.get("renderer") or renderer:
        parts.append(f"renderer {entry.get('renderer') or renderer}")
    if entry.get("set-name"):
        parts.append(f"set-name {entry['set-name']}")
    others = sorted(str(k) for k in entry if k not in shown)
    if others:
        parts.append("also " + ", ".join(others))
    return parts or ["an empty entry (the twin is still this file's)"]


def netplan_definitions(network: dict, twins: list[dict]) -> list[dict]:
    """Where a netplan file's ``network`` mapping defines one of the twins:
    ``[{"twin", "entry", "how", "sets"}]``."""
    found: list[dict] = []
    renderer = str(network.get("renderer") or "")
    ethernets = network.get("ethernets")
    by_id: dict[str, dict] = {}
    for ident, entry in (ethernets if isinstance(ethernets, dict) else {}).items():
        entry = entry if isinstance(entry, dict) else {}
        match = entry.get("match")
        for twin in twins:
            if isinstance(match, dict) and match:
                if not _netplan_match(match, twin):
                    continue
                terms = ", ".join(f"{k} {v}" for k, v in sorted(match.items()))
                how = f"ethernets.{ident}, match {terms}"
            elif str(ident) == twin["netdev"]:
                how = f"ethernets.{ident}"
            else:
                continue
            by_id[str(ident)] = twin
            found.append(
                {"twin": twin["netdev"], "entry": f"ethernets.{ident}", "how": how,
                 "sets": _netplan_sets(entry, renderer)}
            )  # fmt: skip
    for kind, word in (("bonds", "bond"), ("bridges", "bridge")):
        groups = network.get(kind)
        for ident, entry in (groups if isinstance(groups, dict) else {}).items():
            members = _listed(entry.get("interfaces")) if isinstance(entry, dict) else []
            for member in members:
                twin = by_id.get(member) or next((t for t in twins if t["netdev"] == member), None)
                if twin is not None:
                    found.append(
                        {"twin": twin["netdev"], "entry": f"{kind}.{ident}",
                         "how": f"{kind}.{ident}.interfaces names {member}",
                         "sets": [f"the twin a member of {word} {ident}, which takes its address"]}
                    )  # fmt: skip
    return found


# --------------------------------------------------------------------------- NetworkManager


def parse_keyfile(text: str) -> dict[str, dict[str, str]]:
    """A NetworkManager keyfile (GLib's key file format): {section: {key: value}}."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for raw in str(text).splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1].strip(), {})
            continue
        if current is None or "=" not in line:
            raise DefinitionError(f"not a line of a keyfile: {line[:60]!r}")
        key, value = line.split("=", 1)
        current[key.strip()] = value.strip()
    return sections


def nm_ignores(path: str, uid: int, mode: int) -> str:
    """Why NetworkManager does not load this keyfile ("" when it does): by its name, or
    because it is not root's alone (an owner other than root, or any group or other bit)."""
    name = posixpath.basename(path)
    if name.startswith(".") or name.endswith("~") or _NM_TEMPORARY.search(name):
        return "a hidden, backup or temporary file"
    if name.lower().endswith((".pem", ".der")):
        return "a certificate or key"
    if uid != 0:
        return f"owned by uid {uid}, not root"
    if mode & 0o077:
        return f"mode {mode:04o} (NetworkManager loads only files that root alone can read)"
    return ""


def _nm_list(value: str) -> list[str]:
    """A keyfile list: items separated by ';' (a backslash keeps one in an item)."""
    items = re.split(r"(?<!\\);", str(value or ""))
    return [item.replace("\\;", ";").strip() for item in items if item.strip()]


def nm_match_names(patterns: list[str], netdev: str) -> bool:
    """``[match] interface-name``: shell patterns; ``|`` (the default) optional, ``&``
    mandatory, ``!`` inverts (``!x`` alone is ``&!x``), a leading backslash escapes. At least
    one optional element (if any) and every mandatory one must hold."""
    optional, mandatory = [], []
    for item in patterns:
        kind = ""
        if item[:1] in ("|", "&"):
            kind, item = item[0], item[1:]
        inverted = item.startswith("!")
        if inverted:
            item = item[1:]
            kind = kind or "&"
        if item.startswith("\\"):
            item = item[1:]
        hit = fnmatchcase(netdev, item) != inverted
        (mandatory if kind == "&" else optional).append(hit)
    return (not optional or any(optional)) and all(mandatory)


def _nm_mac(value: str) -> str:
    """``AA:BB:CC:DD:EE:FF`` or the older byte list ``170;187;...`` -> ``aa:bb:cc:dd:ee:ff``."""
    value = str(value or "").strip().rstrip(";")
    if ";" in value and all(p.strip().isdigit() for p in value.split(";")):
        return ":".join(f"{int(p):02x}" for p in value.split(";"))
    return value.lower()


def _nm_sets(profile: dict[str, dict[str, str]]) -> list[str]:
    parts = []
    for family in ("ipv4", "ipv6"):
        section = profile.get(family) or {}
        method = section.get("method")
        addresses = [
            re.split(r"[,;]", v)[0].strip()
            for k, v in sorted(section.items())
            if _NM_ADDRESS_KEY.match(k) and v.strip()
        ]
        if method:
            parts.append(
                f"{family}.method {method}"
                + (" (DHCP)" if method == "auto" and family == "ipv4" else "")
            )
        if addresses:
            parts.append(f"{family} addresses " + ", ".join(addresses))
    ethernet = profile.get("ethernet") or profile.get("802-3-ethernet") or {}
    if ethernet.get("mtu"):
        parts.append(f"mtu {ethernet['mtu']}")
    connection = profile.get("connection") or {}
    controller = connection.get("controller") or connection.get("master")
    if controller:
        parts.append(f"a port of {controller}")
    if connection.get("autoconnect", "").lower() == "false":
        parts.append("autoconnect false (active only when someone brings it up)")
    return parts or ["no address or MTU (NetworkManager still takes the twin over)"]


def keyfile_definitions(profile: dict[str, dict[str, str]], twins: list[dict]) -> list[dict]:
    """Where an ethernet profile binds one of the twins: ``[{"twin", "entry", "how", "sets"}]``."""
    connection = profile.get("connection") or {}
    ethernet = profile.get("ethernet") or profile.get("802-3-ethernet")
    kind = connection.get("type") or ("ethernet" if ethernet is not None else "")
    if kind not in _NM_ETHERNET:
        return []
    ifname = connection.get("interface-name", "")
    mac = _nm_mac((ethernet or {}).get("mac-address", ""))
    patterns = _nm_list((profile.get("match") or {}).get("interface-name", ""))
    if not (ifname or mac or patterns):
        return []
    how = "; ".join(
        part
        for part in (
            f"interface-name={ifname}" if ifname else "",
            f"mac-address={mac}" if mac else "",
            "[match] interface-name=" + ";".join(patterns) if patterns else "",
        )
        if part
    )
    name = connection.get("id") or connection.get("uuid") or ""
    found = []
    for twin in twins:
        if ifname and ifname != twin["netdev"]:
            continue
        if mac and mac not in twin["macs"]:
            continue
        if patterns and not nm_match_names(patterns, twin["netdev"]):
            continue
        found.append(
            {"twin": twin["netdev"], "entry": name, "how": how, "sets": _nm_sets(profile),
             "uuid": connection.get("uuid", "")}
        )  # fmt: skip
    return found


# --------------------------------------------------------------------------- the decision


def _under(path: str, dirs: list[str]) -> str:
    parent = posixpath.dirname(path)
    return next((d for d in dirs if posixpath.normpath(d) == parent), "")


def _twins_said(hits: list[dict]) -> str:
    return "; ".join(f"twin {h['twin']} ({h['how']}): {', '.join(h['sets'])}" for h in hits)


def _netplan_refusal(host: str, path: str, hits: list[dict], own: str, dirs: list[str]) -> str:
    entries = ", ".join(dict.fromkeys(h["entry"] for h in hits))
    return (
        f"{host}: {path} also defines {_twins_said(hits)}. netplan merges every file in "
        f"{', '.join(dirs)} with host_prep's {own}, so the twin would get a second address, "
        f"another MTU or another renderer. Move the file out of those directories (sudo mv "
        f"{path} /root/), or remove {entries} from it, then run again"
    )


def _nm_refusal(host: str, path: str, hits: list[dict], nm_dir: str) -> str:
    name, uuid = hits[0]["entry"], hits[0]["uuid"]
    named = f" ('{name}')" if name else ""
    delete = f"sudo nmcli connection delete {uuid or name}" if uuid or name else f"sudo rm {path}"
    return (
        f"{host}: NetworkManager profile {path}{named} binds {_twins_said(hits)}. "
        "NetworkManager can activate it on the twin beside host_prep's netplan file. Delete it "
        f"({delete}), or move it out of {nm_dir} and run sudo nmcli connection reload, then "
        "run again"
    )


def leftover_definitions(
    listing: dict,
    twins: list[dict],
    own: str,
    host: str,
    netplan_dirs: list[str],
    nm_dirs: list[str],
) -> dict:
    """Every netplan file and NetworkManager profile that defines one of ``twins``
    (``twins_from_facts``), but host_prep's own file ``own``.

    ``listing`` is the find command's result (``stdout``, ``stderr``, ``rc``, ``msg``;
    ``parse_listing`` reads it): rc 1 with only missing directories on stderr is an answer,
    any other failure is refused, as a check that could not read the files proves nothing.

    ``netplan_dirs`` in netplan's precedence (/run/netplan, /etc/netplan, /lib/netplan),
    ``nm_dirs`` NetworkManager's keyfile directories. Returns ``{"passed", "errors",
    "found", "read", "ignored", "message"}``: one error per twin a file defines, per file
    that cannot be read or parsed, and for a file that shadows ``own``.
    """
    own = posixpath.normpath(str(own))
    netplan_dirs = [posixpath.normpath(str(d)) for d in netplan_dirs]
    nm_dirs = [posixpath.normpath(str(d)) for d in nm_dirs]
    out = {"passed": False, "errors": [], "found": [], "read": [], "ignored": [], "message": ""}
    rc = int(listing.get("rc") or 0)
    stderr = str(listing.get("stderr") or "")
    try:
        parsed = parse_listing(str(listing.get("stdout") or ""), stderr)
    except DefinitionError as exc:
        out["errors"].append(f"{host}: cannot read the listing of the network files: {exc}")
        return out
    if rc not in (0, 1) or (rc == 1 and not stderr.strip()):
        said = " ".join((stderr or str(listing.get("msg") or "")).split())[:200] or "no message"
        out["errors"].append(
            f"{host}: listing the netplan files and NetworkManager profiles failed (rc {rc}: "
            f"{said}); host_prep cannot tell whether another file defines the twins"
        )
        return out
    listing = parsed
    out["errors"].extend(f"{host}: find said: {line}" for line in listing["problems"])
    # netplan reads *.yaml only; of several files with one name, the directory first in
    # netplan_dirs wins.
    chosen: dict[str, tuple[int, dict]] = {}
    for entry in listing["files"]:
        where = _under(entry["path"], netplan_dirs)
        if where and entry["path"].endswith(".yaml"):
            rank = netplan_dirs.index(where)
            name = posixpath.basename(entry["path"])
            if name not in chosen or rank < chosen[name][0]:
                chosen[name] = (rank, entry)
    own_dir = _under(own, netplan_dirs)
    own_rank = netplan_dirs.index(own_dir) if own_dir else len(netplan_dirs)
    for name, (rank, entry) in sorted(chosen.items()):
        path = entry["path"]
        if path == own or (name == posixpath.basename(own) and rank > own_rank):
            # host_prep's file, or one that host_prep's file shadows.
            continue
        if name == posixpath.basename(own) and own_dir:
            out["errors"].append(
                f"{host}: {path} has the name of host_prep's {own} in a directory netplan "
                f"prefers, so netplan reads it instead of host_prep's file. Remove it (sudo rm "
                f"{path}), then run again"
            )
            continue
        if entry["text"] is None:
            out["errors"].append(
                f"{host}: {path} could not be read: host_prep cannot tell whether it defines a twin"
            )
            continue
        out["read"].append(path)
        try:
            network = load_netplan(entry["text"])
        except DefinitionError as exc:
            out["errors"].append(
                f"{host}: {path} is {exc}; netplan would refuse it too. Fix or remove it, "
                "then run again"
            )
            continue
        hits = netplan_definitions(network, twins)
        out["found"].extend({"file": path, **hit} for hit in hits)
        if hits:
            refusal = _netplan_refusal(host, path, hits, own, netplan_dirs)
            if OWN_HEADING in entry["text"]:
                refusal += (
                    " (it carries this collection's heading: an earlier "
                    "host_prep_netplan_file left it)"
                )
            out["errors"].append(refusal)
    for entry in listing["files"]:
        nm_dir = _under(entry["path"], nm_dirs)
        if not nm_dir:
            continue
        path = entry["path"]
        why = nm_ignores(path, entry["uid"], entry["mode"])
        if why:
            out["ignored"].append(f"{path} ({why})")
            continue
        if entry["text"] is None:
            out["errors"].append(
                f"{host}: {path} could not be read: host_prep cannot tell whether it binds a twin"
            )
            continue
        try:
            profile = parse_keyfile(entry["text"])
        except DefinitionError as exc:
            out["ignored"].append(f"{path} ({exc}: NetworkManager cannot load it either)")
            continue
        out["read"].append(path)
        hits = keyfile_definitions(profile, twins)
        out["found"].extend({"file": path, **hit} for hit in hits)
        if hits:
            out["errors"].append(_nm_refusal(host, path, hits, nm_dir))
    out["passed"] = not out["errors"]
    names = ", ".join(t["netdev"] for t in twins) or "no twin"
    read = ", ".join(out["read"]) or "none besides host_prep's own"
    ignored = (
        f"; NetworkManager loads none of {', '.join(out['ignored'])}" if out["ignored"] else ""
    )
    out["message"] = (
        f"{host}: no other netplan file or NetworkManager profile defines {names} "
        f"(read: {read}{ignored})"
        if out["passed"]
        else "\n".join(out["errors"])
    )
    return out
