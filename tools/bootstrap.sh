#!/usr/bin/env bash
# Make a fresh Debian/Ubuntu machine able to run `make demo` and `make test`: a Docker
# Engine (docker.io) that is running, debootstrap, the OpenSSH client, rsync and Python's
# venv. Used by the Makefile's demo and test targets and by .ci/run.
#
#   root, not on a terminal (CI):      installs and starts what is missing
#   not root, on a terminal:           says what it will do, asks, then uses sudo
#   not root, not on a terminal:       says what to run, and stops
#   DGX_SPARK_BOOTSTRAP_YES=1          answers yes instead of asking
set -euo pipefail

log() { printf 'bootstrap: %s\n' "$*"; }
die() { printf 'bootstrap: %s\n' "$*" >&2; exit 1; }

packages=()
command -v dockerd >/dev/null 2>&1 || packages+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || packages+=(debootstrap)
command -v ssh-keygen >/dev/null 2>&1 || packages+=(openssh-client)
command -v rsync >/dev/null 2>&1 || packages+=(rsync)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || packages+=(python3-venv)

daemon_up() { "$@" docker info >/dev/null 2>&1; }

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)

start_daemon=false
if ! daemon_up; then
  # A running daemon that only root may use is not one to start again.
  if [ "${#sudo_cmd[@]}" -gt 0 ] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null \
      && daemon_up sudo -n; then
    die "the Docker daemon runs, but $(id -un) may not use it: add the account to the docker group (sudo usermod -aG docker $(id -un)) and log in again, or run make as root"
  fi
  start_daemon=true
fi

if [ "${#packages[@]}" -eq 0 ] && ! $start_daemon; then
  exit 0
fi

plan=()
[ "${#packages[@]}" -gt 0 ] && plan+=("install ${packages[*]} with apt-get")
$start_daemon && plan+=("start the Docker daemon")

if [ "${#sudo_cmd[@]}" -gt 0 ]; then
  if [ "${DGX_SPARK_BOOTSTRAP_YES:-}" != 1 ]; then
    if [ ! -t 0 ]; then
      die "this machine needs to ${plan[*]/%/;} run tools/bootstrap.sh in a terminal (it asks, then uses sudo), or as root"
    fi
    printf 'bootstrap: this machine needs to:\n'
    printf '  - %s\n' "${plan[@]}"
    read -r -p 'bootstrap: do that now with sudo? [y/N] ' answer
    case "$answer" in
      y|Y|yes|YES) ;;
      *) die "nothing changed; do the above yourself, then run make again" ;;
    esac
  fi
  command -v sudo >/dev/null 2>&1 || die "sudo is missing: run tools/bootstrap.sh as root"
fi

if [ "${#packages[@]}" -gt 0 ]; then
  command -v apt-get >/dev/null 2>&1 \
    || die "apt-get is missing (not Debian or Ubuntu): install ${packages[*]} with this system's package manager"
  log "installing ${packages[*]}"
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${packages[@]}" >/dev/null
fi

if $start_daemon && ! daemon_up "${sudo_cmd[@]}"; then
  if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    log "starting docker.service"
    "${sudo_cmd[@]}" systemctl start docker
  else
    # No service manager (a container, a CI job): dockerd in the background, as root.
    log "starting dockerd (log: /tmp/dgx-spark-dockerd.log)"
    "${sudo_cmd[@]}" sh -c 'nohup dockerd >/tmp/dgx-spark-dockerd.log 2>&1 &'
  fi
  for _ in $(seq 60); do
    daemon_up "${sudo_cmd[@]}" && break
    sleep 1
  done
  daemon_up "${sudo_cmd[@]}" || {
    tail -n 30 /tmp/dgx-spark-dockerd.log 2>/dev/null || true
    die "the Docker daemon did not answer within 60 s"
  }
fi

if ! daemon_up; then
  die "the Docker daemon runs, but $(id -un) may not use it: add the account to the docker group (sudo usermod -aG docker $(id -un)) and log in again, or run make as root"
fi
log "ready: $(docker version --format 'Docker Engine {{.Server.Version}}' 2>/dev/null || echo 'Docker Engine')"
