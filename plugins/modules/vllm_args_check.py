#!/usr/bin/python
# Copyright: contributors to the dgx_spark.cluster collection
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: vllm_args_check
short_description: Ask the vLLM in a serving image whether it accepts a vllm serve command line
version_added: "0.1.0"
description:
  - Runs the image's own vLLM, in a short-lived container on the target node, on the
    arguments that would follow C(vllm serve), without starting a server. Nothing loads
    weights, reads the model's configuration or touches a GPU.
  - The container builds the parser of C(vllm serve) as vLLM's CLI does
    (C(vllm.entrypoints.cli.serve), which calls vLLM's own C(make_arg_parser)), parses the
    arguments, runs the CLI's C(validate), imports the parser plugins the arguments name,
    and builds C(AsyncEngineArgs.from_cli_args), which checks the JSON sub-configurations.
  - With O(model_config), it then builds vLLM's model configuration from the model directory
    as the engine does first (C(EngineArgs.create_model_config), from C(config.json) and the
    tokenizer's files, no weights, no device), which checks the model's own limits (a
    C(--max-model-len) beyond what the model allows, an architecture or a quantization this
    vLLM cannot build, a C(config.json) the image's transformers cannot read). The model must
    be mounted (O(volumes)) where the ranks see it; without a C(config.json) there the step is
    skipped and RV(model_config) says so.
  - It also reads vLLM's registries of reasoning parsers and tool-call parsers and checks
    the names given with C(--reasoning-parser) and C(--tool-call-parser) against them. A
    registry that cannot be read is a refusal, never a silent pass.
  - Each refusal names the setting of the C(dgx_spark.cluster.vllm_serve) role that gives
    the argument and quotes vLLM's message, trimmed.
  - The probe container has networking disabled and is always removed.
  - It keeps nothing; the vllm_serve role stamps an acceptance (dgx_spark.cluster.stamp) and
    asks again only when an input of that stamp changed.
author:
  - dgx_spark.cluster contributors (!UNKNOWN)
attributes:
  check_mode:
    support: full
    description:
      - The probe changes nothing on the node, so it runs in check mode too.
  diff_mode:
    support: none
    description: The module changes nothing, so there is no diff.
extends_documentation_fragment:
  - dgx_spark.cluster.image_run
options:
  image:
    description:
      - The serving image, by name, C(name:tag) or ID, as the node's Docker daemon knows it.
    type: str
    required: true
  args:
    description:
      - The arguments after C(vllm serve), the model first, exactly as the launcher passes
        them.
    type: list
    elements: str
    required: true
  env:
    description:
      - Environment of the probe container; give the serving container's, since vLLM reads
        settings from its environment while it parses.
    type: dict
    default: {}
  volumes:
    description:
      - Bind mounts (C(host:container[:mode])), always made read-only, so that paths the
        arguments name (the model, a chat template, a parser plugin) exist as they will for
        the server.
    type: list
    elements: str
    default: []
  model_config:
    description:
      - Also build vLLM's model configuration from the model directory the arguments name.
    type: bool
    default: true
  fail_on_refusal:
    description:
      - Fail when vLLM refuses the arguments, with a message that names each setting.
      - With V(false) the module reports RV(refused) and RV(problems) and succeeds.
    type: bool
    default: true
notes:
  - The probe runs without GPUs and without a network (E(HF_HUB_OFFLINE=1) unless O(env) says
    otherwise), as the image's user. A check that vLLM makes only once it knows the device
    (memory, the KV cache) is not made here; the role's rollback covers those.
seealso:
  - module: dgx_spark.cluster.vllm_registry_info
  - name: vLLM engine arguments
    description: The arguments C(vllm serve) accepts.
    link: https://docs.vllm.ai/en/latest/configuration/engine_args.html
"""

EXAMPLES = r"""
---
- name: Ask the serving image's vLLM whether it accepts the command line
  dgx_spark.cluster.vllm_args_check:
    image: dgx-spark/vllm-serving:current
    args:
      - /var/lib/dgx-spark/models/Qwen3.5-122B-A10B-FP8
      - --tensor-parallel-size
      - "2"
      - --reasoning-parser
      - qwen3
      - --enable-auto-tool-choice
      - --tool-call-parser
      - qwen3_coder
    volumes:
      - /var/lib/dgx-spark/models:/var/lib/dgx-spark/models:ro
    env:
      HF_HUB_OFFLINE: "1"
  become: true

- name: List the tool-call parsers an image knows, without failing
  dgx_spark.cluster.vllm_args_check:
    image: vllm-donor:0.32.0-cpu
    args: [/models/any]
    fail_on_refusal: false
  become: true
  register: donor_parsers

- name: Show them
  ansible.builtin.debug:
    var: donor_parsers.registries.tool.names
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
  sample: dgx-spark/vllm-serving:current
image_id:
  description: The image's ID on the node.
  returned: always
  type: str
  sample: sha256:99fd34947539a4d2f0f1e0a3e5a5b7a9f0a1d2c3b4a5968778695a4b3c2d1e0f
vllm_version:
  description: vLLM's version from the image's installed metadata.
  returned: always
  type: str
  sample: 0.32.0+cpu
refused:
  description: Whether vLLM refused anything (RV(problems) is not empty).
  returned: always
  type: bool
  sample: false
problems:
  description:
    - One entry per refusal. C(setting) is the vllm_serve variable that gives the argument
      (V(vllm_serve_extra_args) for flags the role does not manage, V(vllm_serve_image) when
      the image's vLLM cannot be asked at all); C(flag) the argument, or null; C(stage) where
      it was refused (V(import), V(parser), V(parse), V(validate), V(plugins),
      V(engine_args), V(model_config), V(registry)); C(message) vLLM's words, trimmed; a
      refusal of the model's configuration names V(vllm_serve_image) for what the image's vLLM
      cannot build, else the setting it is about or V(vllm_serve_model_path).
  returned: always
  type: list
  elements: dict
  sample:
    - setting: vllm_serve_extra_args
      flag: --max-num-seqs
      stage: parse
      message: "argument --max-num-seqs: invalid int value: 'abc'"
registries:
  description:
    - The image's registries of C(reasoning) and C(tool) (tool-call) parsers, each with its
      C(names), the C(source) it was read from and the C(error) that kept it from being read.
  returned: always
  type: dict
  sample:
    reasoning:
      names: [deepseek_r1, qwen3]
      source: vllm.reasoning.ReasoningParserManager.list_registered()
      error: null
    tool:
      names: [hermes, qwen3_coder]
      source: vllm.tool_parsers.ToolParserManager.list_registered()
      error: null
seconds:
  description: Seconds the probe ran inside the container (mostly importing vLLM).
  returned: always
  type: float
  sample: 6.4
model_config:
  description:
    - What vLLM's model configuration says of the model (C(max_model_len), C(architectures),
      C(quantization), C(dtype)); a string when the step was skipped; null when it was not
      asked for or vLLM refused (see RV(problems), stage V(model_config)).
  returned: always
  type: raw
  sample: {"max_model_len": 2048, "architectures": ["Qwen3MoeForCausalLM"],
           "quantization": null, "dtype": "torch.bfloat16"}
timings:
  description: Seconds of each step of the probe.
  returned: always
  type: dict
  sample: {"import": 6.32, "parse": 0.01, "registries": 0.0, "engine_args": 0.0}
"""

# Ansible's layout puts the documentation before the imports, hence the noqa: E402.
import socket  # noqa: E402
import traceback  # noqa: E402

from ansible.module_utils.basic import AnsibleModule, env_fallback, missing_required_lib  # noqa: E402
from ansible_collections.dgx_spark.cluster.plugins.module_utils.image_run import (  # noqa: E402
    ImageRunError as CheckError,
)
from ansible_collections.dgx_spark.cluster.plugins.module_utils.image_run import (  # noqa: E402
    connect,
    run_in_image,
)
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_args_probe import (  # noqa: E402
    args_probe_entrypoint,
    args_probe_request,
    judge,
    read_only,
    refusal_message,
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


def probe_environment(env: dict) -> dict:
    """The probe container's environment: offline unless ``env`` says otherwise."""
    return {"HF_HUB_OFFLINE": "1", **{str(k): str(v) for k, v in env.items()}}


def ask_image(client, node: str, params: dict) -> tuple[str, dict]:
    """(image ID, probe document), with errors named for the user."""
    probe = {
        "entrypoint": args_probe_entrypoint,
        "command": [args_probe_request(params["args"], params["model_config"])],
        "environment": probe_environment(params["env"]),
        "volumes": read_only(params["volumes"]),
        "timeout": params["timeout"],
        "label": "vllm_args_check",
    }
    missing = "build or load it there first (playbooks/images.yml)"
    return run_in_image(client, node, params["image"], params["python"], probe, missing)


def result_of(params: dict, node: str, image_id: str, doc: dict) -> dict:
    problems = judge(doc, params["args"])
    result = {
        "changed": False,
        "node": node,
        "image": params["image"],
        "image_id": image_id,
        "vllm_version": doc.get("vllm"),
        "refused": bool(problems),
        "problems": problems,
        "registries": doc.get("registries") or {},
        "model_config": doc.get("model_config"),
        "seconds": doc.get("seconds"),
        "timings": doc.get("timings") or {},
    }
    if problems:
        result["msg"] = refusal_message(problems, params["image"], node, doc.get("vllm"))
    return result


def run_module(params: dict, node: str) -> dict:
    client = connect(params["docker_host"], node)
    try:
        image_id, doc = ask_image(client, node, params)
    except (APIError, DockerException, RequestException) as exc:
        raise CheckError(
            f"Docker on node {node} failed while running {params['image']}: {exc}"
        ) from exc
    finally:
        client.close()
    return result_of(params, node, image_id, doc)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "image": {"type": "str", "required": True},
            "args": {"type": "list", "elements": "str", "required": True},
            "env": {"type": "dict", "default": {}},
            "volumes": {"type": "list", "elements": "str", "default": []},
            "python": {"type": "str"},
            "docker_host": {
                "type": "str",
                "default": "unix:///var/run/docker.sock",
                "fallback": (env_fallback, ["DOCKER_HOST"]),
            },
            "timeout": {"type": "int", "default": 300},
            "model_config": {"type": "bool", "default": True},
            "fail_on_refusal": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    if not HAS_DOCKER:
        module.fail_json(msg=missing_required_lib("docker"), exception=DOCKER_IMPORT_ERROR)
    node = socket.gethostname()
    try:
        result = run_module(module.params, node)
    except CheckError as exc:
        module.fail_json(msg=str(exc), node=node, image=module.params["image"])
    if result["refused"] and module.params["fail_on_refusal"]:
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
