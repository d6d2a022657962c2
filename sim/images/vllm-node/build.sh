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

echo "step 1/2: Ray ${ray} into the system Python from the wheelhouse"
python3 -m pip install --break-system-packages --no-index --no-cache-dir --find-links /wheels \
    --disable-pip-version-check -q "ray==${ray}"

echo "step 2/2: the CUDA images' entrypoint script"
install -D -m 0755 /build/nvidia_entrypoint.sh /opt/nvidia/nvidia_entrypoint.sh
