# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: collection_digest
short_description: Digest of this collection's roles, plugins and playbooks
version_added: "0.1.0"
description:
  - Internal to the collection (the in-step check of C(deploy.yml)), not a stable interface.
  - One SHA-256 over the names and contents of every file under C(roles/), C(plugins/) and
    C(playbooks/) of the installed collection, and its C(deploy.yml).
  - The rule, so that anyone can recompute it. Take those files' paths relative to the
    collection's root, with C(/) between folders, leaving out C(__pycache__) folders and
    C(.pyc) files; in the sorted order of those paths, feed each path in UTF-8, one NUL byte
    and the 32-byte SHA-256 of the file's contents into one SHA-256; the digest is its
    hexadecimal form.
  - C(deploy.yml) puts it among what a converge was given (the converge role's record), so
    that a changed collection (an upgrade, a local edit) is never mistaken for a no-op.
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
options: {}
"""

EXAMPLES = r"""
- name: Show the collection's digest
  ansible.builtin.debug:
    msg: "{{ lookup('dgx_spark.cluster.collection_digest') }}"
"""

RETURN = r"""
_raw:
  description: The digest, as one hexadecimal string.
  type: list
  elements: str
"""

import hashlib  # noqa: E402
import os  # noqa: E402

from ansible.plugins.lookup import LookupBase  # noqa: E402

PARTS = ("roles", "plugins", "playbooks", "deploy.yml")


def tree_digest(root: str, parts: tuple[str, ...] = PARTS) -> str:
    """SHA-256 over relative names and contents, in a fixed order; caches are left out."""
    digest = hashlib.sha256()
    files = []
    for part in parts:
        top = os.path.join(root, part)
        if os.path.isfile(top):
            files.append(part)
        for folder, dirs, names in os.walk(top):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files.extend(
                os.path.relpath(os.path.join(folder, name), root)
                for name in names
                if not name.endswith(".pyc")
            )
    for name in sorted(files):
        digest.update(name.encode() + b"\0")
        with open(os.path.join(root, name), "rb") as handle:
            digest.update(hashlib.sha256(handle.read()).digest())
    return digest.hexdigest()


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        return [tree_digest(root)]
