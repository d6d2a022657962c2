#!/usr/bin/env bash
# `ansible-test sanity` on the collection as it ships, with no ignore file. ansible-test only
# runs inside .../ansible_collections/<namespace>/<name>/, so this builds the tarball
# (`ansible-galaxy collection build`: what galaxy.yml's build_ignore leaves out stays out, the
# one list of what is not the collection), installs it into a throwaway collections path under
# .cache/sanity and runs there, on the Python of the project's virtualenv. Extra arguments go
# to ansible-test (e.g. --test pep8).
set -euo pipefail
cd "$(dirname "$0")/.."

bin=$(cd "${VENV:-.venv}/bin" && pwd)
export PATH=$bin:$PATH
root=$PWD/.cache/sanity
tree=$root/ansible_collections/dgx_spark/cluster
version=$("$bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

rm -rf "$root/ansible_collections" "$root/dist"
"$bin/ansible-galaxy" collection build --output-path "$root/dist" .
# --no-deps: sanity reads community.docker and ansible.posix from the virtualenv's ansible.
"$bin/ansible-galaxy" collection install --no-deps --force -p "$root" "$root"/dist/*.tar.gz 2>&1 \
  | grep -v 'not part of the configured Ansible collections paths' || true
test -f "$tree/MANIFEST.json"
# A repository of its own: ansible-test lists the files of the nearest enclosing git
# repository, and in the checkout's this tree is ignored.
git -C "$tree" init -q
git -C "$tree" add -A

# ansible-test keeps one virtualenv per sanity test under ~/.ansible/test; keep them in the
# throwaway tree instead, where a later run reuses them.
export HOME=$root/home
# ansible-test makes those virtualenvs without pip and downloads get-pip.py from its own CI
# host, which only the package index is reachable beside. This stand-in gives the new
# virtualenv the pip of Python's ensurepip, then lets that pip install what was asked for
# (the pip version ansible-test pins) from the package index.
pip_version=$("$bin/python" -c '
import sys, types
from ansible_test._internal.python_requirements import get_venv_packages
print(get_venv_packages(types.SimpleNamespace(version=sys.argv[1]))["pip"])' "$version")
get_pip=$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py
mkdir -p "$(dirname "$get_pip")"
cat >"$get_pip" <<'PY'
"""Stand-in for get-pip.py: pip from ensurepip, then pip installs the requested packages."""

import subprocess
import sys

# In a process of its own: ensurepip turns off the pip configuration of the process it runs in.
subprocess.check_call([sys.executable, "-m", "ensurepip"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "pip", "install", *args])
if "--no-setuptools" in sys.argv:
    subprocess.check_call([sys.executable, "-m", "pip", "uninstall", "-q", "-y", "setuptools"])
PY

cd "$tree"
# Skipped, each for a reason:
#   shellcheck: no shell scripts left in the tree, and no shellcheck in the virtualenv.
#   pslint: the collection has no PowerShell.
exec "$bin/ansible-test" sanity --local --python "$version" --color no \
  --skip-test shellcheck \
  --skip-test pslint \
  "$@"
