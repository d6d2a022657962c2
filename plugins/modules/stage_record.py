#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stage_record
short_description: Keep what a stage was given and what it found on a node, for the next run
version_added: "0.1.0"
description:
  - Writes a record of one shape, the one every record of the collection has, to O(path)
    on the node. It holds C(format), O(inputs) (what the stage was given, resolved), a
    C(digest) of them, and O(kept) (what the stage found or left).
  - The next run reads the record back and compares its own inputs with it. host_prep's link
    check, vllm_serve's two-rank collective and model_cache's verification skip their work
    when nothing they read changed.
  - The shape, the reader and the comparison are in
    C(plugins/module_utils/deployment_record.py) (C(stage_record), C(read_stage_record),
    C(inputs_changed)). The deployment record of the C(deployment_state) module has the same
    shape.
  - The write is atomic (a temporary file, then renamed over the record). A missing directory
    is made, mode C(0700). A record that already says the same is left as it is.
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Reports whether the record would change, and writes nothing.
  diff_mode:
    support: none
    description: The record is bookkeeping, not configuration.
options:
  path:
    description: The record file.
    type: path
    required: true
  inputs:
    description: What the stage was given, after defaults (settings, the image ID, a digest).
    type: dict
    required: true
  kept:
    description: What the stage found or left (a time, results, a manifest), beside the inputs.
    type: dict
    default: {}
  mode:
    description: The record file's permissions, as an octal string.
    type: str
    default: "0644"
"""

EXAMPLES = r"""
- name: Record the passed link check
  dgx_spark.cluster.stage_record:
    path: /var/lib/dgx-spark/link-check.json
    inputs: "{{ link_settings }}"
    kept:
      checked_at: "{{ now(utc=true, fmt='%Y-%m-%dT%H:%M:%SZ') }}"
  become: true
"""

RETURN = r"""
record:
  description: The record as written (or as it would be, in check mode).
  returned: always
  type: dict
"""

import json  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils.deployment_record import (  # noqa: E402
    stage_record,
    write_record,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "inputs": {"type": "dict", "required": True},
            "kept": {"type": "dict", "default": {}},
            "mode": {"type": "str", "default": "0644"},
        },
        supports_check_mode=True,
    )
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
            write_record(params["path"], record, mode)
        except OSError as exc:
            module.fail_json(msg=f"cannot write {params['path']}: {exc}")
    module.exit_json(changed=changed, record=record)


if __name__ == "__main__":
    main()
