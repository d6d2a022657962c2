#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: converge_record
short_description: Tell whether a node is as the last converge left it, or record it
version_added: "0.1.0"
description:
  - A run of C(deploy.yml) is either a no-op or a converge. With O(state=compared) this module
    reads the node's converge record (O(path)) and compares it with what the run was given
    (O(settings), O(common)) and what the node holds now (the collection's containers, the
    images, host files, trees and firewall tables O(left) lists). Any difference is named in
    RV(reasons), one line each, a changed setting with its old and new value; so is a running
    rank container on another image than O(serving_image). RV(noop) is true when there is
    none.
  - With O(state=present), the last play of a converge writes the record anew, unless it
    would say the same but for its time (then nothing changes).
  - The comparison is C(plugins/module_utils/converge_record.py); the converge role runs
    this module (C(roles/converge)).
  - The write is atomic (a temporary file, then renamed over the record), mode C(0600); a
    missing directory is made, mode C(0755), as it may hold others' files (the record's
    default directory holds the weights' directory, which the SSH user copies between nodes).
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: O(state=compared) only reads; O(state=present) reports what it would write.
  diff_mode:
    support: none
    description: The record is bookkeeping, not configuration.
options:
  path:
    description: The converge record.
    type: path
    default: /var/lib/dgx-spark/converged.json
  settings:
    description:
      - Every setting the run was given, by name, as resolved on the node. The record keeps
        the values; a name that says key, password, token or secret is kept as a digest.
    type: dict
    required: true
  common:
    description:
      - What every node shares, as the record keeps it (the inventory's nodes and groups, the
        collection's digest).
    type: dict
    required: true
  left:
    description:
      - What a converge leaves that the record keeps, each a list; C(images) (references
        whose IDs are kept), C(files) (host files, by SHA-256; a missing one counts too),
        C(trees) (directories such as the weights, by the size and modification time of every
        file below them, following links, hidden entries left out) and C(tables) (live
        nftables tables, C(family name), by a digest of C(nft -s list table); absent or
        without C(nft) counts as empty). The collection's containers (label O(label)) are
        always kept.
    type: dict
    required: true
  label:
    description: Label key that marks the collection's containers.
    type: str
    default: dgx_spark.cluster.component
  serving_image:
    description:
      - The alias the ranks run. Every running container of component C(ray) or C(vllm) must
        run the image behind it; one that runs another is named, whatever the record says.
    type: str
    default: ""
  state:
    description: C(compared) reads and compares; C(present) writes the record.
    type: str
    choices: [compared, present]
    default: compared
requirements:
  - docker (Python SDK) on the node
"""

EXAMPLES = r"""
- name: Tell whether this node is as the last converge left it
  dgx_spark.cluster.converge_record:
    settings: "{{ settings }}"
    common:
      nodes: [10.0.0.1, 10.0.0.2]
      collection: "{{ lookup('dgx_spark.cluster.collection_digest') }}"
    left:
      files: [/etc/dgx-spark/comm.env]
      tables: [inet dgx_spark]
      images: [dgx-spark/vllm-serving:current]
    serving_image: dgx-spark/vllm-serving:current
  register: noop

- name: Record what this converge left
  dgx_spark.cluster.converge_record:
    settings: "{{ settings }}"
    common: "{{ common }}"
    left: {files: [/etc/dgx-spark/comm.env]}
    state: present
"""

RETURN = r"""
noop:
  description:
    - The node is as the last converge left it, with the same settings and collection
      (O(state=compared)).
  returned: always
  type: bool
reasons:
  description: What differs from the record, one line each; empty when RV(noop).
  returned: always
  type: list
  elements: str
recorded_at:
  description: When the last converge wrote the record (UTC), empty without one.
  returned: always
  type: str
"""

import time  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils.converge_record import (  # noqa: E402
    ITEMS,
    compare,
    converge_record,
    file_digest,
    read_converge_record,
    recorded_inputs,
    snapshot,
    text_digest,
    tree_stat,
    write_record,
)

# A directory the module makes for a record: others may need to pass it (the default
# /var/lib/dgx-spark holds the weights, which the SSH user's rsync reads and writes).
DIR_MODE = 0o755

try:
    import docker
except ImportError:
    docker = None


def read_record(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return read_converge_record(handle.read())
    except OSError:
        return None


def inspect_all(client, label: str) -> list[dict]:
    listed = client.api.containers(all=True, filters={"label": label})
    inspected = []
    for entry in listed:
        try:
            inspected.append(client.api.inspect_container(entry["Id"]))
        except docker.errors.NotFound:
            continue  # removed between the listing and the inspection
    return inspected


def image_ids(client, refs: list[str]) -> dict[str, str]:
    ids = {}
    for ref in refs:
        try:
            ids[ref] = client.api.inspect_image(ref)["Id"]
        except docker.errors.NotFound:
            ids[ref] = ""
    return ids


def table_digests(module: AnsibleModule, tables: list[str]) -> dict[str, str]:
    nft = module.get_bin_path("nft")
    out = {}
    for table in tables:
        if nft is None:
            out[table] = ""
            continue
        # -s: stateless, so the counters of refused connections do not count as a change.
        rc, stdout, _err = module.run_command([nft, "-s", "list", "table", *table.split()])
        out[table] = text_digest(stdout) if rc == 0 else ""
    return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/dgx-spark/converged.json"},
            "settings": {"type": "dict", "required": True, "no_log": False},
            "common": {"type": "dict", "required": True},
            "left": {"type": "dict", "required": True},
            "label": {"type": "str", "default": "dgx_spark.cluster.component"},
            "serving_image": {"type": "str", "default": ""},
            "state": {"type": "str", "choices": ["compared", "present"], "default": "compared"},
        },
        supports_check_mode=True,
    )
    params = module.params
    if docker is None:
        module.fail_json(msg=missing_required_lib("docker"))
    unknown = sorted(set(params["left"]) - set(ITEMS))
    if unknown:
        module.fail_json(msg=f"left names {', '.join(unknown)}; allowed: {', '.join(ITEMS)}")
    read = {kind: sorted(set(params["left"].get(kind) or [])) for kind in ITEMS}
    serving = params["serving_image"]
    try:
        client = docker.from_env()
        containers = snapshot(inspect_all(client, params["label"]))
        images = image_ids(client, read["images"])
        serving_id = images.get(serving) or (
            image_ids(client, [serving])[serving] if serving else ""
        )
    except docker.errors.DockerException as exc:
        module.fail_json(msg=f"cannot ask the Docker engine: {exc}")
    now = {
        "inputs": recorded_inputs(params["settings"], params["common"]),
        "containers": containers,
        "images": images,
        "files": {path: file_digest(path) for path in read["files"]},
        "trees": {root: tree_stat(root) for root in read["trees"]},
        "tables": table_digests(module, read["tables"]),
        "serving_image": {"ref": serving, "id": serving_id},
    }
    record = read_record(params["path"])
    at = (record or {}).get("at", "")
    if params["state"] == "compared":
        reasons = compare(record, now)
        module.exit_json(changed=False, noop=not reasons, reasons=reasons, recorded_at=at)
    # A record that says the same but for its time is left as it is: its time says when a
    # converge first left the node so, and a converge that changed nothing changes nothing.
    if record is not None and not compare(record, now):
        module.exit_json(changed=False, noop=False, reasons=[], recorded_at=at)
    now_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if not module.check_mode:
        write_record(params["path"], converge_record(now, now_at), dir_mode=DIR_MODE)
    module.exit_json(changed=True, noop=False, reasons=[], recorded_at=now_at)


if __name__ == "__main__":
    main()
