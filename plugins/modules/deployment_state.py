#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deployment_state
short_description: Keep the stages' records on a node, and tell whether it is still as recorded
version_added: "0.1.0"
description:
  - With O(state=recorded), a stage of C(deploy.yml) records at its end, in a root-only file,
    what it was given (its entry of O(fingerprint)) and what it left, as O(left) lists for it
    (images, host files, trees, nftables tables, the containers of its components with ID,
    image, running, start time, restarts). What the other stages recorded stays.
  - With O(state=compared), reads that file and compares it with the O(fingerprint) given and
    the node as it is now. Any difference (a stage without a record, a changed setting, a
    container stopped, restarted, recreated or missing, a node that rebooted, an image
    reference that names another image, a host file or weight edited, a firewall table
    flushed) is named in RV(reasons), and so is a running rank container on another image
    than O(serving_image). RV(stages) are the stages of C(deploy.yml) those differences
    concern, each the first stage in O(left) that leaves what differs.
  - The comparison is C(plugins/module_utils/deployment_record.py).
  - C(deploy.yml) runs the stages from the earliest any node names on; a rerun with nothing to
    do costs a comparison and one completion instead of every stage's checks.
  - The deploy_state role runs it, O(state=compared) in its C(in_step) entry point and
    O(state=recorded) in its C(record) entry point, which every stage playbook ends with.
  - With O(state=kept), writes one record of a check a stage keeps for itself to O(path)
    (host_prep's link check, vllm_serve's two-rank collective, model_cache's verification)
    in the shape every record of the collection has, C(format), O(inputs), a C(digest) of
    them and O(kept); the stage skips the check next time when its inputs are the same. A
    record that already says the same is left as it is.
  - Every write is atomic (a temporary file, then renamed over the record); a missing
    directory is made, mode C(0755), as it may hold others' files (the record's default
    directory holds the weights' directory, which the SSH user copies between nodes).
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: O(state=compared) only reads; the others report what they would write.
  diff_mode:
    support: none
    description: The record is bookkeeping, not configuration.
options:
  path:
    description: The record file (with O(state=kept), the check's own record).
    type: path
    default: /var/lib/dgx-spark/deployed.json
  fingerprint:
    description:
      - What each stage of C(deploy.yml) (C(host_prep), C(images), C(model), C(ray), C(serve),
        C(monitoring)) is given, by stage, the digest of every setting it reads and, under
        C(common), of the inventory and the collection
        (C(plugins/plugin_utils/deploy_stages.py)).
      - With O(state=recorded), O(stage)'s entry is its record's inputs; each stage's record
        has the shape of every record the stages keep (C(stage_record) in
        C(plugins/module_utils/deployment_record.py)). A file of another shape (an older
        collection's) counts as none, and every stage runs.
      - Required with O(state=compared) and O(state=recorded).
    type: dict
  inputs:
    description:
      - With O(state=kept), what the check was given, after defaults (settings, the image ID, a
        digest).
    type: dict
  kept:
    description: With O(state=kept), what the check found (a time, results, a manifest).
    type: dict
    default: {}
  label:
    description: Label key that marks the collection's containers.
    type: str
    default: dgx_spark.cluster.component
  left:
    description:
      - What each stage leaves, by stage in C(deploy.yml)'s order, each with any of
        C(images) (references whose IDs the stage reads; one that now names another image,
        a donor pulled anew, an alias retagged, is named), C(files) (host files, by SHA-256;
        a missing one counts too), C(trees) (directories such as the weights, by the size and
        modification time of every file below them, following links, hidden entries left
        out), C(tables) (live nftables tables, C(family name), by a digest of C(nft -s list
        table); absent or without C(nft) counts as empty) and C(components) (the values of
        O(label) whose containers the stage starts or moves).
      - A stage's entry may also have C(handed), of the same kinds, naming what the stages
        before it leave that it uses (the host files the ranks load, the weights, the Ray
        containers the serving group runs in). Its record keeps a digest of each as it was
        then; O(state=compared) names the stage when one differs now and no stage that leaves
        it is named for it already. So a run that starts at an earlier stage asks again at a
        later one's turn (C(deploy.yml)), which runs only when something it uses moved.
      - With O(state=compared) all of it is compared, and a difference concerns the first
        stage that leaves it; with O(state=recorded) the entry of O(stage) is recorded.
      - Required with O(state=compared) and O(state=recorded).
    type: dict
  mode:
    description: With O(state=kept), the record file's permissions, as an octal string.
    type: str
    default: "0644"
  serving_image:
    description:
      - The alias the ranks run. Every running container of component C(ray) or C(vllm) must
        run the image behind it; one that runs another is named, whatever the record says.
    type: str
    default: ""
  stage:
    description: With O(state=recorded), the stage that records.
    type: str
  state:
    description:
      - C(compared) reads and compares, C(recorded) writes a stage's record in the deployment
        record, C(kept) writes a check's own record.
    type: str
    choices: [compared, recorded, kept]
    default: compared
requirements:
  - docker (Python SDK) on the node, except with O(state=kept)
"""

EXAMPLES = r"""
- name: Tell whether this node is as the stages left it
  dgx_spark.cluster.deployment_state:
    fingerprint: "{{ settings | dgx_spark.cluster.deploy_state('fingerprints', inventory) }}"
    left:
      host_prep: {files: [/etc/dgx-spark/comm.env], tables: [inet dgx_spark]}
      ray: {components: [ray]}
    serving_image: dgx-spark/vllm-serving:current
  register: in_step

- name: Record what the ray stage left on the node
  dgx_spark.cluster.deployment_state:
    fingerprint: "{{ settings | dgx_spark.cluster.deploy_state('fingerprints', inventory) }}"
    left:
      ray: {components: [ray, ray-probe]}
    stage: ray
    state: recorded

- name: Record the passed link check
  dgx_spark.cluster.deployment_state:
    path: /var/lib/dgx-spark/link-check.json
    inputs: "{{ link_settings }}"
    kept:
      checked_at: "{{ now(utc=true, fmt='%Y-%m-%dT%H:%M:%SZ') }}"
    state: kept
  become: true
"""

RETURN = r"""
record:
  description: The check's record as written, or as it would be in check mode (O(state=kept)).
  returned: when O(state=kept)
  type: dict
in_step:
  description: The fingerprint and every container are as recorded (O(state=compared)).
  returned: unless O(state=kept)
  type: bool
reasons:
  description: What differs from the record, one line each; empty when in step.
  returned: unless O(state=kept)
  type: list
  elements: str
stages:
  description:
    - The stages of C(deploy.yml) that RV(reasons) concern, each once (a stage without a
      record or whose inputs changed, the host files' and the firewall's C(host_prep), an
      image reference's C(images), the weights' C(model), a container's the stage that
      starts it); C(host_prep), every stage, for a node without a record. Empty when in
      step. The run starts at the earliest over all nodes.
  returned: unless O(state=kept)
  type: list
  elements: str
containers:
  description: The collection's containers on the node now, by name.
  returned: unless O(state=kept)
  type: dict
images:
  description: The image ID behind each image O(left) lists, now (empty when absent).
  returned: unless O(state=kept)
  type: dict
"""

import json  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils.deployment_record import (  # noqa: E402
    ITEMS,
    KINDS,
    compare_stages,
    file_digest,
    handed,
    read_deployment_record,
    recorded,
    snapshot,
    stage_record,
    stages_concerned,
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
            return read_deployment_record(handle.read())
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


def keep(module: AnsibleModule) -> None:
    """state=kept: a check's own record at path, written when it would say something else."""
    params = module.params
    try:
        mode = int(params["mode"], 8)
    except ValueError:
        module.fail_json(msg=f"mode is {params['mode']!r}; allowed: an octal string, like 0644")
    reserved = sorted({"format", "inputs", "digest"} & set(params["kept"]))
    if reserved:
        module.fail_json(msg=f"kept names {', '.join(reserved)}: the record's own fields")
    record = stage_record(params["inputs"], **params["kept"])
    try:
        with open(params["path"], encoding="utf-8") as handle:
            before = json.load(handle)
    except (OSError, ValueError):
        before = None
    changed = before != json.loads(json.dumps(record, sort_keys=True, default=str))
    if changed and not module.check_mode:
        try:
            write_record(params["path"], record, mode, DIR_MODE)
        except OSError as exc:
            module.fail_json(msg=f"cannot write {params['path']}: {exc}")
    module.exit_json(changed=changed, record=record)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/dgx-spark/deployed.json"},
            "fingerprint": {"type": "dict"},
            "inputs": {"type": "dict"},
            "kept": {"type": "dict", "default": {}},
            "label": {"type": "str", "default": "dgx_spark.cluster.component"},
            "left": {"type": "dict"},
            "mode": {"type": "str", "default": "0644"},
            "serving_image": {"type": "str", "default": ""},
            "stage": {"type": "str"},
            "state": {
                "type": "str",
                "choices": ["compared", "recorded", "kept"],
                "default": "compared",
            },
        },
        required_if=[
            ("state", "compared", ["fingerprint", "left"]),
            ("state", "recorded", ["fingerprint", "left", "stage"]),
            ("state", "kept", ["inputs"]),
        ],
        supports_check_mode=True,
    )
    params = module.params
    if params["state"] == "kept":
        keep(module)
    if docker is None:
        module.fail_json(msg=missing_required_lib("docker"))
    stage = params["stage"]
    if params["state"] == "recorded" and (
        stage not in params["fingerprint"] or stage not in params["left"]
    ):
        module.fail_json(
            msg=f"the fingerprint and left must both have an entry for stage {stage!r}"
        )
    # What is read: what every stage leaves and is handed, to compare; to record, what the
    # recording stage leaves (its record's "left") and is handed (its own record's "handed").
    recording = params["state"] == "recorded"
    parts = [params["left"][stage]] if recording else list(params["left"].values())
    given = [(part or {}).get("handed") or {} for part in parts]
    items = {kind: [i for part in parts for i in (part or {}).get(kind) or []] for kind in KINDS}
    read = {
        kind: {*items[kind], *(i for spec in given for i in spec.get(kind) or [])} for kind in KINDS
    }
    try:
        client = docker.from_env()
        containers = snapshot(inspect_all(client, params["label"]))
        images = image_ids(client, sorted(read["images"]))
        serving = params["serving_image"]
        # The alias is usually among the images read already; a stage's record reads none.
        serving_id = images.get(serving) or (
            image_ids(client, [serving])[serving] if serving else ""
        )
    except docker.errors.DockerException as exc:
        module.fail_json(msg=f"cannot ask the Docker engine: {exc}")
    now = {
        "fingerprint": params["fingerprint"],
        "containers": containers,
        "images": images,
        "files": {path: file_digest(path) for path in sorted(read["files"])},
        "trees": {root: tree_stat(root) for root in sorted(read["trees"])},
        "tables": table_digests(module, sorted(read["tables"])),
        "serving_image": {"ref": serving, "id": serving_id},
    }
    record = read_record(params["path"])
    if params["state"] == "compared":
        found = compare_stages(record, now, params["left"])
        module.exit_json(
            changed=False,
            in_step=not found,
            reasons=[reason for _stage, reason in found],
            stages=stages_concerned(found),
            containers=containers,
            images=images,
        )
    # The record's "left" keeps what the stage leaves only: an item it is merely handed stays
    # as the stage that leaves it recorded it (a comm.env edited by hand stays host_prep's).
    mine = {kind: {i: v for i, v in now[kind].items() if i in items[kind]} for kind in ITEMS}
    handed_now = handed(given[0], now)
    wanted = recorded(record, {**now, **mine, "handed": handed_now}, stage, items["components"])
    changed = record != wanted
    if changed and not module.check_mode:
        write_record(params["path"], wanted, dir_mode=DIR_MODE)
    module.exit_json(
        changed=changed,
        in_step=True,
        reasons=[],
        stages=[],
        containers=containers,
        images=images,
    )


if __name__ == "__main__":
    main()
