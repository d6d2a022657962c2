#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: stamp
short_description: Tell whether a costly check passed with these inputs, and note when it did
version_added: "0.1.0"
description:
  - A stamp is a node's note that a check passed (the link benchmarks, the two-rank collective,
    the weights' verification, vLLM's acceptance of the command line, an image's NCCL answer),
    one JSON file C(<dir>/<name>.json) with the check's O(name), its O(inputs) themselves, a
    short O(result), when it passed (C(passed_at), UTC) and C(format).
  - With O(state=check), reads the stamp and compares its inputs with O(inputs);
    RV(valid) says the check may be skipped, RV(reason) says in one line why it is skipped or
    why it runs (for example that there is no stamp, or which input changed from what to
    what). Changes nothing.
  - With O(state=present), after the check passed, writes the stamp. It is rewritten only when
    its name, inputs, result or format differ; a stamp that says the same keeps the time it
    first passed with them, and the task reports no change.
  - With O(state=absent), removes the stamp. With O(state=listed), reads every stamp in O(dir)
    (for the status report); O(name) is not needed.
  - The logic is C(plugins/module_utils/stamp.py).
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: O(state=check) and O(state=listed) only read; the others report what they would do.
  diff_mode:
    support: none
    description: A stamp is bookkeeping, not configuration.
options:
  name:
    description:
      - The check's name, the stamp's file name without C(.json) (letters, digits, C(.), C(_)
        and C(-)).
      - Required unless O(state=listed).
    type: str
  dir:
    description:
      - The directory of the node's stamps (C(spark_stamp_dir)); made root's alone (C(0700))
        when missing, each stamp C(0600).
    type: path
    default: /var/lib/dgx-spark/stamps
  inputs:
    description:
      - What the check depends on, the values themselves (settings, an image ID, a text); a
        large value may be given as its digest. A change of any of them makes the check run
        again, and RV(differences) names it.
    type: dict
    default: {}
  trees:
    description:
      - Directories (or files) on the node whose files count as inputs too, each by the size
        and modification time of every file below it (links followed to what they name), as
        the input C(tree <path>) holding 16 hex digits of their digest.
      - A tree with more than 20000 entries, or with a directory that cannot be read, is never
        the same; O(state=check) says the check runs, and O(state=present) writes no stamp.
    type: list
    elements: path
    default: []
  result:
    description: With O(state=present), a short note of what passed (a mapping or a string).
    type: raw
    default: {}
  state:
    description:
      - C(check) reads and compares, C(present) writes after a pass, C(absent) removes,
        C(listed) reads every stamp in O(dir).
    type: str
    choices: [check, present, absent, listed]
    default: check
notes:
  - A force knob of a check (C(host_prep_link_check=always)) is the call site's to honour; it
    runs the check whatever RV(valid) says, and writes the stamp after it passed.
"""

EXAMPLES = r"""
- name: Ask whether the link benchmarks passed with these settings
  dgx_spark.cluster.stamp:
    name: link-check
    dir: "{{ spark_stamp_dir }}"
    inputs:
      mtu: 9000
      comm_env: "{{ comm_env_text }}"
      kernel: "{{ ansible_facts.kernel }}"
  register: link_stamp
  become: true

- name: Say why
  ansible.builtin.debug:
    msg: "{{ link_stamp.reason }}"

- name: Stamp the pass
  dgx_spark.cluster.stamp:
    name: link-check
    dir: "{{ spark_stamp_dir }}"
    inputs: "{{ link_stamp.inputs }}"
    result: {rdma_gbps: 96.4, nccl_busbw_gbps: 22.1}
    state: present
  become: true

- name: Ask whether vLLM accepted this command line with these model files
  dgx_spark.cluster.stamp:
    name: vllm-args
    inputs:
      image_id: "{{ image_id }}"
      args: "{{ serve_args }}"
    trees: [/var/lib/dgx-spark/models]
  register: args_stamp
  become: true

- name: List every stamp of the node
  dgx_spark.cluster.stamp:
    state: listed
  register: stamps
  become: true
"""

RETURN = r"""
valid:
  description: The stamp holds for O(inputs); the check may be skipped (O(state=check)).
  returned: when O(state=check)
  type: bool
  sample: false
reason:
  description: One line on why the check is skipped or runs.
  returned: when O(state=check)
  type: str
  sample: "runs: mtu changed from 1500 to 9000"
differences:
  description:
    - Each input that differs from the stamp's, by name with its old and new value, shortened.
  returned: when O(state=check)
  type: list
  elements: str
  sample: ["mtu: 1500 -> 9000"]
stamp:
  description:
    - The stamp read (O(state=check)), or as written or as it would be (O(state=present)); null
      where there is none.
  returned: when O(state=check) or O(state=present)
  type: dict
inputs:
  description: O(inputs) with each of O(trees) as C(tree <path>), as compared or written.
  returned: when O(state=check) or O(state=present)
  type: dict
msg:
  description: RV(reason), or what was written or removed.
  returned: always
  type: str
stamps:
  description: Every stamp in O(dir) by name; null for one that cannot be read.
  returned: when O(state=listed)
  type: dict
lines:
  description: Every stamp in O(dir), one line each with its age, result and inputs.
  returned: when O(state=listed)
  type: list
  elements: str
"""

from datetime import UTC, datetime  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils import stamp as st  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils.converge_record import (  # noqa: E402
    tree_fingerprint,
)


def resolved_inputs(params: dict) -> dict:
    """O(inputs), with each of O(trees) read on the node."""
    trees = {f"tree {p}": st.tree_input(tree_fingerprint(p)) for p in params["trees"]}
    return {**(params["inputs"] or {}), **trees}


def run(params: dict, check_mode: bool, now: datetime) -> dict:
    """The module's answer for plain parameters; raises ValueError and OSError."""
    directory, state = params["dir"], params["state"]
    if state == "listed":
        stamps = st.load_all(directory)
        return {
            "changed": False,
            "stamps": stamps,
            "lines": st.status_lines(stamps, now),
            "msg": f"{len(stamps)} stamps in {directory}",
        }
    name = st.check_name(params["name"])
    if state == "absent":
        there = st.remove(directory, name, dry=check_mode)
        return {"changed": there, "msg": f"{name}: {'removed' if there else 'no stamp'}"}
    inputs = resolved_inputs(params)
    old = st.load(directory, name)
    if state == "check":
        return {"changed": False, "inputs": inputs, "msg": "", **st.check(name, old, inputs, now)}
    incomplete = sorted(k for k, v in inputs.items() if v == st.INCOMPLETE)
    if incomplete:
        return {
            "changed": False,
            "inputs": inputs,
            "stamp": None,
            "msg": f"{name}: not stamped, {', '.join(incomplete)} could not be read whole",
        }
    new = st.make(name, inputs, params["result"], now)
    if st.same(old, new):
        return {"changed": False, "inputs": inputs, "stamp": old, "msg": f"{name}: stamped"}
    if not check_mode:
        st.write(directory, new)
    return {"changed": True, "inputs": inputs, "stamp": new, "msg": f"{name}: stamped"}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str"},
            "dir": {"type": "path", "default": st.DEFAULT_DIR},
            "inputs": {"type": "dict", "default": {}},
            "trees": {"type": "list", "elements": "path", "default": []},
            "result": {"type": "raw", "default": {}},
            "state": {
                "type": "str",
                "choices": ["check", "present", "absent", "listed"],
                "default": "check",
            },
        },
        required_if=[
            ("state", "check", ["name"]),
            ("state", "present", ["name"]),
            ("state", "absent", ["name"]),
        ],
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode, datetime.now(UTC))
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    except OSError as exc:
        module.fail_json(msg=f"{module.params['dir']}: {exc}")
    if module.params["state"] == "check":
        result["msg"] = result["reason"]
    module.exit_json(**result)


if __name__ == "__main__":
    main()
