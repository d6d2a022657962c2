#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nccl_choice
short_description: Decide which libnccl the ranks load, the serving image's or the nodes'
version_added: "0.1.0"
description:
  - Weighs the NCCL version the serving image reports on every node against the version of
    every node's own libnccl, for C(spark_nccl_library) V(auto), V(image) or V(host).
  - V(auto) keeps the image's NCCL unless it is in 2.28.x, the range with public reports of
    TP=2 ranks wedging in a collective on two GB10 Sparks
    (U(https://github.com/vllm-project/vllm/issues/42354),
    U(https://github.com/vllm-project/vllm/issues/41725)), and every node offers the same newer
    version outside it; then the nodes'. Where no node offers a way out it fails, citing those
    reports, and the run goes on only with an explicit V(image) or V(host).
  - Pure computation over its options (logic in C(plugins/module_utils/nccl_choice.py)); it
    reads nothing on the node it runs on. host_prep's preflight runs it once for the pair.
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Reads nothing and changes nothing, so it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
options:
  mode:
    description: C(spark_nccl_library).
    type: str
    choices: [auto, image, host]
    default: auto
  image_versions:
    description:
      - Node name to what the serving image's probe printed on that node (C(2.28.9),
        C(2.28.9 from /path/libnccl.so.2), C(none in torch (...))); null where the image is not
        on that node yet.
    type: dict
    default: {}
  host_versions:
    description:
      - Node name to the version in the file name of that node's libnccl (C(2.30.7)); an empty
        string where the node has none or its file name carries no version.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Decide which libnccl the ranks load
  dgx_spark.cluster.nccl_choice:
    mode: auto
    image_versions: {spark-1: "2.28.9", spark-2: "2.28.9"}
    host_versions: {spark-1: "2.30.7", spark-2: "2.30.7"}
  register: choice
  run_once: true
"""

RETURN = r"""
library:
  description: V(image) or V(host); null when refused or when V(auto) waits for the image.
  returned: always
  type: str
  sample: host
pending:
  description: True where V(auto) had no image to weigh (not built on some node yet).
  returned: always
  type: bool
message:
  description: One line saying what was chosen and why, or why the run stops and what to set.
  returned: always
  type: str
image:
  description: The image's NCCL version as weighed (C(none) when unknown).
  returned: always
  type: str
  sample: 2.28.9
warned:
  description: What the run goes on with despite the public reports (also shown as warnings).
  returned: always
  type: list
  elements: str
hosts:
  description: Node name to its libnccl version as weighed (C(none) when it has none).
  returned: always
  type: dict
  sample: {spark-1: 2.30.7, spark-2: 2.30.7}
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (  # noqa: E402
    nccl_choice as nc,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "mode": {"type": "str", "choices": list(nc.MODES), "default": "auto"},
            "image_versions": {"type": "dict", "default": {}},
            "host_versions": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    result = nc.choose_pair(params["image_versions"], params["host_versions"], params["mode"])
    for warning in result["warnings"]:
        module.warn(warning)
    out = {k: result[k] for k in ("library", "pending", "message", "image", "hosts")}
    out["warned"] = result["warnings"]
    if not result["passed"]:
        module.fail_json(msg=result["message"], **{k: v for k, v in out.items() if k != "message"})
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
