#!/bin/sh
# Each node generates its own host keys, so node-to-node trust has real keys to pin.
set -eu
ssh-keygen -A >/dev/null
mkdir -p /run/sshd
/usr/sbin/sshd -E /var/log/sshd.log
exec dockerd --log-level=warn
