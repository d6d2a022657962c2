#!/bin/sh
# Each node generates its own host keys, so node-to-node trust has real keys to pin.
set -eu
ssh-keygen -A >/dev/null
mkdir -p /run/sshd
/usr/sbin/sshd -E /var/log/sshd.log
# host_prep's firewall, loaded before dockerd as dgx-spark-firewall.service does on a Spark, so
# a restarted node has its cluster ports closed again; a node that fails it still starts.
firewall=/etc/dgx-spark/firewall.nft
if [ -f "$firewall" ]; then
    nft -f "$firewall" \
        || echo "dgxsim-node: nft -f $firewall failed; cluster ports open until host_prep runs" >&2
fi
exec dockerd --log-level=warn
