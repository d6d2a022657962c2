# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: module_utils_source
short_description: The source of this collection's module_utils, for scripts that run on a node
version_added: "0.1.0"
description:
  - Internal to the collection (vllm_serve's watchdog, host_prep's NCCL check), not a stable
    interface.
  - Returns the text of each named file of the collection's C(plugins/module_utils), found the
    way Ansible imports it (the collection loader), so a role can install it beside a script
    that runs on a node without reaching into the collection's folders by path.
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
options:
  _terms:
    description: Module names, without C(.py) (for example C(vllm_log)).
    type: list
    elements: str
    required: true
"""

EXAMPLES = r"""
- name: Install the log grammar beside the watchdog
  ansible.builtin.copy:
    content: "{{ lookup('dgx_spark.cluster.module_utils_source', 'vllm_log') }}"
    dest: /etc/dgx-spark/vllm/vllm_log.py
    mode: "0644"
"""

RETURN = r"""
_raw:
  description: Each module's source text, in the order asked.
  type: list
  elements: str
"""

import importlib.util  # noqa: E402
import re  # noqa: E402

from ansible.errors import AnsibleLookupError  # noqa: E402
from ansible.plugins.lookup import LookupBase  # noqa: E402

PACKAGE = "ansible_collections.dgx_spark.cluster.plugins.module_utils"
_NAME = re.compile(r"[a-z_][a-z0-9_]*")


def source(name: str) -> str:
    """The text of module_utils/<name>.py; a name that is not one of them is refused."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise AnsibleLookupError(f"module_utils_source: {name!r} is not a module name")
    spec = importlib.util.find_spec(f"{PACKAGE}.{name}")
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise AnsibleLookupError(f"module_utils_source: no module_utils named {name!r}")
    with open(spec.origin, encoding="utf-8") as handle:
        return handle.read()


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [source(term) for term in terms]
