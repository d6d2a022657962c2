#!/bin/sh
# Stand-in for the base owners build with spark-vllm-docker's build script: a CUDA image's
# layout (the system Python's dist-packages, no virtualenv, NVIDIA's entrypoint script) with a
# vLLM that imports the served architecture itself, and Ray. sim/sim_images.py runs this in a
# container of the donor (the same vLLM layer: nothing is installed twice), with the Ray
# wheelhouse at /wheels and this directory at /build, and commits what it wrote; BASE_CONFIG
# there is the image's ENV and ENTRYPOINT. NCCL is not shown: the CPU build has none.
# Usage: build.sh RAY_VERSION
set -eu
ray="$1"
site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

echo "step 1/3: Ray ${ray} into the system Python from the wheelhouse"
python3 -m pip install --break-system-packages --no-index --no-cache-dir --find-links /wheels \
    --disable-pip-version-check -q "ray==${ray}"

# The base stands for one built from a vLLM older than a profile's architecture, as owners
# meet it when a new model comes out: its registry lacks the dense Qwen3 (the sim's second
# tiny model, tiny-qwen3), which the donor's vLLM has. Serving that profile then goes through
# the registry check and the hybrid build for real; the default tiny-qwen3-moe (its own
# entry, kept) is served by the base as it is. Only the one dict entry goes, so the file
# still reads as a registry; the build fails if vLLM spells it otherwise than once.
echo "step 2/3: Qwen3ForCausalLM out of the base's vLLM model registry"
registry="${site}/vllm/model_executor/models/registry.py"
entry='    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),'
found="$(grep -c -x -F -e "${entry}" "${registry}" || true)"
if [ "${found}" != 1 ]; then
    echo "expected the line '${entry}' once in ${registry}, found it ${found} times" >&2
    exit 1
fi
grep -v -x -F -e "${entry}" "${registry}" >/tmp/registry.py
cat /tmp/registry.py >"${registry}"
python3 - <<'PY'
from vllm.model_executor.models.registry import ModelRegistry

archs = ModelRegistry.get_supported_archs()
if "Qwen3ForCausalLM" in archs or "Qwen3MoeForCausalLM" not in archs:
    raise SystemExit("the registry edit did not give Qwen3MoeForCausalLM without Qwen3ForCausalLM")
PY

echo "step 3/3: the CUDA images' entrypoint script"
install -D -m 0755 /build/nvidia_entrypoint.sh /opt/nvidia/nvidia_entrypoint.sh
