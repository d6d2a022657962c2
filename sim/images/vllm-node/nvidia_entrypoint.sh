#!/bin/bash
# Stand-in for /opt/nvidia/nvidia_entrypoint.sh of NVIDIA's CUDA images: a banner on a
# terminal, then the command as given (an image run without one gets a shell).
set -e
if [ -t 1 ]; then
    echo "== CUDA (simulated: a CPU build, no GPU) =="
fi
if [ $# -eq 0 ]; then
    exec /bin/bash
fi
exec "$@"
