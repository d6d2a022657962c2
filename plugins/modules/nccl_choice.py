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
  - Weighs the NCCL the serving image's torch loads on every node (its version and its build,
    size and ELF build ID) against every node's own libnccl (version and build), for
    C(spark_nccl_library) V(auto), V(image) or V(host).
  - The same version can be different builds; the pip wheel nvidia-nccl-cu13 2.28.9 (build ID
    a7f420a1...) wedged TP=2 pairs of Sparks where DGX OS's libnccl2 2.28.9 (build ID
    c0db9360...) ran a 60-minute soak clean
    (U(https://github.com/vllm-project/vllm/issues/42354),
    U(https://github.com/vllm-project/vllm/issues/41725)).
  - V(auto) keeps the image's NCCL unless it is in 2.28.x, the range with those reports, and
    not a build known to run clean; then the nodes' where every node offers the same library and
    it is known good (newer and outside the range, a build known to run clean, or another build
    than the pip wheel's the image carries). Where nothing known good is on offer it fails,
    naming every build weighed, and the run goes on only with an explicit V(image) or V(host).
  - Pure computation over its options (logic in C(plugins/module_utils/nccl_choice.py)); it
    reads nothing on the node it runs on. ray_cluster's preflight runs it once for the pair,
    after a probe in the serving image read both builds.
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
  image_builds:
    description:
      - Node name to the build of the libnccl the serving image's torch maps there, as the
        probe read it (C(path), C(real_path), C(size) in bytes, C(build_id) in hex, C(sha256)
        where the file has no build ID); null where it was not read.
    type: dict
    default: {}
  host_builds:
    description:
      - Node name to the build of that node's libnccl, in the same form as O(image_builds).
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Decide which libnccl the ranks load
  dgx_spark.cluster.nccl_choice:
    mode: auto
    image_versions: {spark-1: "2.28.9", spark-2: "2.28.9"}
    image_builds:
      spark-1: {real_path: /usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2,
                size: 219000000, build_id: a7f420a1}
      spark-2: {real_path: /usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2,
                size: 219000000, build_id: a7f420a1}
    host_versions: {spark-1: "2.28.9", spark-2: "2.28.9"}
    host_builds:
      spark-1: {real_path: /usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9, size: 190000000,
                build_id: c0db9360}
      spark-2: {real_path: /usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9, size: 190000000,
                build_id: c0db9360}
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
image_build:
  description: The build of the image's libnccl as weighed (null when not read).
  returned: always
  type: dict
  sample: {path: /usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2,
           real_path: /usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2,
           size: 219000000, build_id: a7f420a1, sha256: null}
host_builds:
  description: Node name to the build of its libnccl as weighed (null when not read).
  returned: always
  type: dict
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
            "image_builds": {"type": "dict", "default": {}},
            "host_builds": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )
    params = module.params
    result = nc.choose_pair(
        params["image_versions"],
        params["host_versions"],
        params["mode"],
        params["image_builds"],
        params["host_builds"],
    )
    for warning in result["warnings"]:
        module.warn(warning)
    keys = ("library", "pending", "message", "image", "hosts", "image_build", "host_builds")
    out = {k: result[k] for k in keys}
    out["warned"] = result["warnings"]
    if not result["passed"]:
        module.fail_json(msg=result["message"], **{k: v for k, v in out.items() if k != "message"})
    module.exit_json(changed=False, **out)


if __name__ == "__main__":
    main()
