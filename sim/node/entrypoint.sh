#!/bin/sh
# Each node generates its own host keys, so node-to-node trust has real keys to pin.
set -eu
ssh-keygen -A >/dev/null
mkdir -p /run/sshd
/usr/sbin/sshd -E /var/log/sshd.log
# Stand-ins for a Spark's RDMA devices (a ConnectX-7's uverbs and rdma_cm character nodes, with
# their real numbers), so the containers' device settings are applied as on a Spark. Nothing
# behind them answers: RDMA itself stays hardware-only.
mkdir -p /dev/infiniband
[ -e /dev/infiniband/uverbs0 ] || mknod -m 0666 /dev/infiniband/uverbs0 c 231 192
[ -e /dev/infiniband/uverbs1 ] || mknod -m 0666 /dev/infiniband/uverbs1 c 231 193
[ -e /dev/infiniband/rdma_cm ] || mknod -m 0666 /dev/infiniband/rdma_cm c 10 58
# The image store: containerd's, as Docker 29 has on a fresh install (DGX OS), unless the sim
# was brought up with DGXSIM_IMAGE_STORE=classic (the overlay2 store of Docker before 29).
case "${DGXSIM_IMAGE_STORE:-containerd}" in
  containerd) printf '{"features": {"containerd-snapshotter": true}}\n' >/etc/docker/daemon.json ;;
  classic) printf '{"features": {"containerd-snapshotter": false}}\n' >/etc/docker/daemon.json ;;
  *) echo "dgxsim-node: DGXSIM_IMAGE_STORE must be containerd or classic" >&2; exit 2 ;;
esac
# host_prep's firewall, loaded before dockerd as dgx-spark-firewall.service does on a Spark, so
# a restarted node has its cluster ports closed again; a node that fails it still starts.
firewall=/etc/dgx-spark/firewall.nft
if [ -f "$firewall" ]; then
    nft -f "$firewall" \
        || echo "dgxsim-node: nft -f $firewall failed; cluster ports open until host_prep runs" >&2
fi
exec dockerd --log-level=warn
