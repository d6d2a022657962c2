#!/bin/sh
# Cluster entrypoint of the vllm-node image: "head" or "worker" runs this
# node's Ray in the foreground; anything else is executed as given.
set -eu
case "${1:-}" in
  head)
    shift
    exec ray start --head --block \
      --node-ip-address "${VLLM_HOST_IP:?set VLLM_HOST_IP to the fast-link address of this node}" \
      --port "${RAY_PORT:-6379}" "$@"
    ;;
  worker)
    shift
    exec ray start --block \
      --address "${RAY_HEAD_ADDRESS:?set RAY_HEAD_ADDRESS to ip:port of the Ray head}" \
      --node-ip-address "${VLLM_HOST_IP:?set VLLM_HOST_IP to the fast-link address of this node}" "$@"
    ;;
  *)
    exec "$@"
    ;;
esac
