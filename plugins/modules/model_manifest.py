#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_manifest
short_description: Describe a model directory and verify it against a manifest
version_added: "0.1.0"
description:
  - Lists a model's files (weights, configs, tokenizers) with their sizes and, optionally,
    SHA-256 checksums, and compares them with an expected manifest.
  - Understands a plain model directory and a Hugging Face cache repository directory
    (C(models--Org--Name) with C(blobs/), C(refs/) and C(snapshots/)); in the latter the
    snapshot's symlinks are followed to their blobs.
  - Every symlink in the model directory must resolve to an existing file, and inside
    O(path); a dangling symlink (a snapshot copied without its blobs) or one that points
    outside O(path) is reported, and with O(expected) it fails the task.
  - Changes nothing, so it always reports RV(ignore:changed=false).
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description: Only reads files, so it runs the same in check mode.
  diff_mode:
    support: none
    description: Nothing is changed, so there is no diff.
options:
  path:
    description:
      - The directory that holds the model as it is copied between nodes, either the model
        directory itself or a Hugging Face cache repository directory.
      - A missing directory is not an error unless O(expected) is given; RV(exists) is then
        false.
    type: path
    required: true
  revision:
    description:
      - For a Hugging Face cache repository, the snapshot to describe, as a commit hash
        (C(snapshots/<commit>)) or a name resolved through C(refs/<revision>). When neither
        exists and there is exactly one snapshot, that one.
    type: str
    default: main
  patterns:
    description:
      - Shell patterns matched against each file's base name; matching files form the
        manifest. Symlinks are checked whatever their name.
    type: list
    elements: str
    default: ["*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "*.json", "*.model",
              "*.tiktoken", "*.txt", "*.jinja", "*.py"]
  checksum:
    description:
      - Compute each file's SHA-256 and compare it where O(expected) has one. Reads every
        byte (about 1 GB/s per hashing thread on a small x86 machine; O(workers) files at
        once); without it only sizes are compared.
    type: bool
    default: true
  expected:
    description:
      - The manifest to verify against (a previous run's RV(manifest)), mapping relative
        path to C(size) and optionally C(sha256).
      - Missing files, size or checksum differences, dangling and escaping symlinks are
        reported in RV(problems).
    type: dict
  fail_on_mismatch:
    description:
      - Fail when O(expected) is given and RV(problems) is not empty. Off, the module only
        reports (for example to learn RV(missing_bytes) before a copy).
    type: bool
    default: true
  record:
    description:
      - A verification record on the node (JSON with C(format) 1 and C(files), a manifest, as
        the model_cache role writes after a verified run). With it every RV(manifest) entry
        also carries C(mtime_ns), and with O(checksum) a file whose size and modification
        time equal its entry in the record keeps the record's SHA-256 instead of being read
        again.
      - A missing or unreadable record is the same as an empty one, so every file is read.
      - Only read here, never written.
    type: path
  trust_record:
    description:
      - Reuse the SHA-256 of unchanged files from O(record). Off, every file is read again
        (the entries still carry C(mtime_ns), so a new record can be written).
    type: bool
    default: true
  mtimes:
    description:
      - Every RV(manifest) entry also carries C(mtime_ns), the file's modification time in
        nanoseconds (as with O(record)), so that a copy can be compared with its source by
        time, without reading either.
    type: bool
    default: false
  workers:
    description: Files hashed at once.
    type: int
    default: 4
notes:
  - Extra files that are not in O(expected) are not a problem.
"""

EXAMPLES = r"""
---
- name: Describe the head's copy (the source of truth)
  dgx_spark.cluster.model_manifest:
    path: /var/lib/dgx-spark/models/hub/models--Qwen--Qwen3.5-122B-A10B-FP8
    revision: main
  register: head_manifest
  delegate_to: spark-1
  run_once: true

- name: Verify every node against it
  dgx_spark.cluster.model_manifest:
    path: /var/lib/dgx-spark/models/hub/models--Qwen--Qwen3.5-122B-A10B-FP8
    revision: main
    expected: "{{ head_manifest.manifest }}"

- name: Learn how much a copy still has to bring, without failing
  dgx_spark.cluster.model_manifest:
    path: /var/lib/dgx-spark/models/tiny-qwen3-moe
    checksum: false
    expected: "{{ head_manifest.manifest }}"
    fail_on_mismatch: false
  register: present
"""

RETURN = r"""
exists:
  description: Whether a model directory was found under O(path).
  returned: always
  type: bool
  sample: true
layout:
  description: V(absent), V(plain) or V(hf_cache).
  returned: always
  type: str
  sample: hf_cache
model_dir:
  description: The model directory to hand to vLLM (the snapshot for V(hf_cache)); null when absent.
  returned: always
  type: str
  sample: >-
    /var/lib/dgx-spark/models/hub/models--Qwen--Qwen3.5-122B-A10B-FP8/snapshots/0123456789abcdef0123456789abcdef
manifest:
  description:
    - Relative path to C(size) and, with O(checksum), C(sha256); with O(mtimes) or O(record),
      C(mtime_ns).
  returned: always
  type: dict
  sample: {"config.json": {"size": 682, "sha256": "4b5c..."}}
total_bytes:
  description: Sum of the sizes in RV(manifest).
  returned: always
  type: int
  sample: 13253
file_count:
  description: Number of files in RV(manifest).
  returned: always
  type: int
  sample: 4
problems:
  description:
    - Lists C(missing), C(dangling), C(escaping), C(size_mismatch) and C(checksum_mismatch)
      (the last two of C(path), C(expected), C(actual)), and C(missing_bytes).
    - Without O(expected) only the symlink lists can be non-empty.
  returned: always
  type: dict
  sample: {"missing": [], "dangling": ["config.json"], "escaping": [], "size_mismatch": [],
           "checksum_mismatch": [], "missing_bytes": 682}
ok:
  description: No problems.
  returned: always
  type: bool
  sample: true
missing_bytes:
  description: Bytes of O(expected) files that are absent or differ here.
  returned: always
  type: int
  sample: 0
hashed:
  description: Number of files whose SHA-256 was computed by this run.
  returned: always
  type: int
  sample: 4
reused:
  description:
    - Number of files whose SHA-256 came from O(record) (size and modification time unchanged).
  returned: always
  type: int
  sample: 0
free_bytes:
  description: Free bytes on the filesystem of O(path), or of its nearest existing parent.
  returned: always
  type: int
  sample: 65498251264
"""

# Ansible's layout puts the documentation before the imports, hence the noqa: E402.
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (  # noqa: E402
    model_manifest as mm,
)


def run(params: dict) -> dict:
    """The module's work on plain parameters; raises mm.ManifestError."""
    path = params["path"]
    expected = params.get("expected")
    model_dir, layout = mm.find_model_dir(path, params["revision"])
    known = None
    if params.get("record"):
        known = {}
        if params.get("trust_record", True) and os.path.isfile(params["record"]):
            with open(params["record"], encoding="utf-8") as handle:
                known = mm.read_record(handle.read(), model_dir)
    if model_dir is None:
        described = {"files": {}, "dangling": [], "escaping": [], "hashed": [], "reused": []}
    else:
        described = mm.build_manifest(
            model_dir,
            root=path,
            patterns=params["patterns"],
            checksum=params["checksum"],
            workers=params["workers"],
            known=known,
            mtimes=params.get("mtimes", False),
        )
    problems = mm.compare(expected or {}, described, checksum=params["checksum"])
    free = mm.free_bytes(path)[1]
    return {
        "changed": False,
        "exists": model_dir is not None,
        "layout": layout,
        "model_dir": model_dir,
        "manifest": described["files"],
        "total_bytes": mm.total_bytes(described["files"]),
        "file_count": len(described["files"]),
        "problems": problems,
        "ok": mm.is_clean(problems),
        "missing_bytes": problems["missing_bytes"],
        "free_bytes": free,
        "hashed": len(described["hashed"]),
        "reused": len(described["reused"]),
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "revision": {"type": "str", "default": "main"},
            "patterns": {"type": "list", "elements": "str", "default": list(mm.DEFAULT_PATTERNS)},
            "checksum": {"type": "bool", "default": True},
            "expected": {"type": "dict"},
            "fail_on_mismatch": {"type": "bool", "default": True},
            "record": {"type": "path"},
            "trust_record": {"type": "bool", "default": True},
            "mtimes": {"type": "bool", "default": False},
            "workers": {"type": "int", "default": 4},
        },
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = run(params)
    except (mm.ManifestError, OSError) as exc:
        module.fail_json(msg=f"{params['path']}: {exc}")
    if params["expected"] is not None and params["fail_on_mismatch"]:
        if not result["exists"]:
            module.fail_json(msg=f"{params['path']}: no model here", **result)
        if not result["ok"]:
            problems = mm.describe(result["problems"])
            module.fail_json(
                msg=f"{result['model_dir']} does not match the manifest: {problems}", **result
            )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
