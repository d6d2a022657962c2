#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: deployment_state
short_description: Record what a full deploy left on a node, and tell whether it is still so
version_added: "0.1.0"
description:
  - With O(state=recorded), writes the fingerprint of the settings a full run of
    C(deploy.yml) applied, and the collection's containers on the node as they are now (ID,
    image, running, start time, restarts), to a root-only file.
  - With O(state=compared), reads that file and compares it with the fingerprint given and the
    containers as they are now. Any difference (a changed setting, a container stopped,
    restarted, recreated or missing, a node that rebooted) is named in RV(reasons).
  - C(deploy.yml) runs every stage only when a node is not in step; a rerun with nothing to do
    then costs a comparison and one completion instead of every stage's checks.
author:
  - dgx_spark.cluster developers (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: O(state=compared) only reads; O(state=recorded) reports what it would write.
  diff_mode:
    support: none
    description: The record is bookkeeping, not configuration.
options:
  path:
    description: The record file.
    type: path
    default: /var/lib/dgx-spark/deployed.json
  fingerprint:
    description: Digest of everything the run was given (settings, inventory, collection).
    type: str
    required: true
  label:
    description: Label key that marks the collection's containers.
    type: str
    default: dgx_spark.cluster.component
  state:
    description: C(compared) reads and compares, C(recorded) writes.
    type: str
    choices: [compared, recorded]
    default: compared
requirements:
  - docker (Python SDK) on the node
"""

EXAMPLES = r"""
- name: Tell whether this node is as the last full deploy left it
  dgx_spark.cluster.deployment_state:
    fingerprint: "{{ settings | to_json(sort_keys=true) | hash('sha256') }}"
  register: in_step

- name: Record what this run left on the node
  dgx_spark.cluster.deployment_state:
    fingerprint: "{{ settings | to_json(sort_keys=true) | hash('sha256') }}"
    state: recorded
"""

RETURN = r"""
in_step:
  description: The fingerprint and every container are as recorded (O(state=compared)).
  returned: always
  type: bool
reasons:
  description: What differs from the record, one line each; empty when in step.
  returned: always
  type: list
  elements: str
containers:
  description: The collection's containers on the node now, by name.
  returned: always
  type: dict
"""

import json  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, missing_required_lib  # noqa: E402

try:
    import docker
except ImportError:
    docker = None


def snapshot(inspected: list[dict]) -> dict:
    """The parts of ``docker inspect`` answers that change when a container is touched."""
    containers = {}
    for attrs in inspected:
        state = attrs.get("State") or {}
        containers[attrs["Name"].lstrip("/")] = {
            "id": attrs["Id"],
            "image": attrs.get("Image", ""),
            "running": bool(state.get("Running")),
            "started_at": state.get("StartedAt", ""),
            "restarts": int(attrs.get("RestartCount") or 0),
        }
    return containers


def compare(record: dict | None, fingerprint: str, containers: dict) -> list[str]:
    """What differs between the record of the last full deploy and this node now."""
    if not record:
        return ["no record of a full deploy on this node"]
    reasons = []
    if record.get("fingerprint") != fingerprint:
        reasons.append("the settings, inventory or collection changed since the last full deploy")
    recorded = record.get("containers") or {}
    for name in sorted(set(recorded) | set(containers)):
        before, now = recorded.get(name), containers.get(name)
        if before is None:
            reasons.append(f"{name}: not there at the last full deploy")
        elif now is None:
            reasons.append(f"{name}: gone")
        elif before["id"] != now["id"]:
            reasons.append(f"{name}: recreated")
        elif before["running"] and not now["running"]:
            reasons.append(f"{name}: not running")
        elif before != now:
            reasons.append(f"{name}: restarted or changed since the last full deploy")
    return reasons


def read_record(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_record(path: str, record: dict) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(record, handle, sort_keys=True, indent=1)
        handle.write("\n")
    os.replace(tmp, path)


def inspect_all(client, label: str) -> list[dict]:
    listed = client.api.containers(all=True, filters={"label": label})
    inspected = []
    for entry in listed:
        try:
            inspected.append(client.api.inspect_container(entry["Id"]))
        except docker.errors.NotFound:
            continue  # removed between the listing and the inspection
    return inspected


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "default": "/var/lib/dgx-spark/deployed.json"},
            "fingerprint": {"type": "str", "required": True},
            "label": {"type": "str", "default": "dgx_spark.cluster.component"},
            "state": {"type": "str", "choices": ["compared", "recorded"], "default": "compared"},
        },
        supports_check_mode=True,
    )
    if docker is None:
        module.fail_json(msg=missing_required_lib("docker"))
    params = module.params
    try:
        containers = snapshot(inspect_all(docker.from_env(), params["label"]))
    except docker.errors.DockerException as exc:
        module.fail_json(msg=f"cannot ask the Docker engine: {exc}")
    record = read_record(params["path"])
    if params["state"] == "compared":
        reasons = compare(record, params["fingerprint"], containers)
        module.exit_json(changed=False, in_step=not reasons, reasons=reasons, containers=containers)
    wanted = {"fingerprint": params["fingerprint"], "containers": containers}
    changed = record != wanted
    if changed and not module.check_mode:
        write_record(params["path"], wanted)
    module.exit_json(changed=changed, in_step=True, reasons=[], containers=containers)


if __name__ == "__main__":
    main()
