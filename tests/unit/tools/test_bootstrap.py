"""tools/bootstrap.sh against stand-in commands: what a fresh machine gets, as root in CI, and
without root on a terminal (asked first) or off one (told what to run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tools" / "bootstrap.sh"
REAL = (
    "bash",
    "sh",
    "env",
    "seq",
    "sleep",
    "tail",
    "cat",
    "touch",
    "true",
    "chmod",
    "nohup",
)
MISSING = ("dockerd", "debootstrap", "ssh-keygen", "rsync")

STUBS = {
    "id": 'case "$1" in -u) echo "$FAKE_UID" ;; -un) echo tester ;; esac\n',
    "sudo": 'echo "sudo $*" >> "$LOG"\n[ "$1" = -n ] && shift\nexec "$@"\n',
    "apt-get": (
        'echo "apt-get $*" >> "$LOG"\n'
        'if [ "$1" = install ]; then for tool in dockerd debootstrap ssh-keygen rsync; do\n'
        '  printf "#!/bin/sh\\n%s\\n" "$(cat "$BIN/.$tool")" > "$BIN/$tool"\n'
        '  chmod +x "$BIN/$tool"\n'
        "done; fi\n"
    ),
    "docker": (
        'case "$1" in\n'
        '  info) [ -e "$STATE/daemon" ] ;;\n'
        '  version) echo "Docker Engine 20.10.24" ;;\n'
        "esac\n"
    ),
}
# What each tool does once "installed": dockerd starts the stand-in daemon.
INSTALLED = {
    "dockerd": 'echo dockerd >> "$LOG"; touch "$STATE/daemon"',
    "debootstrap": "true",
    "ssh-keygen": "true",
    "rsync": "true",
}


@pytest.fixture
def machine(tmp_path):
    """A fresh machine: apt-get, sudo and the docker client, nothing else installed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in REAL:
        os.symlink(shutil.which(name), bin_dir / name)
    # The interpreter running the tests (a pyenv shim on PATH would need pyenv's PATH).
    os.symlink(sys.executable, bin_dir / "python3")
    for name, body in STUBS.items():
        (bin_dir / name).write_text("#!/bin/sh\n" + body)
        (bin_dir / name).chmod(0o755)
    for name, body in INSTALLED.items():
        (bin_dir / f".{name}").write_text(body)
    (tmp_path / "state").mkdir()
    return tmp_path


def run(machine: Path, uid: int, stdin=subprocess.DEVNULL, **env) -> subprocess.CompletedProcess:
    environ = {
        "PATH": str(machine / "bin"),
        "FAKE_UID": str(uid),
        "LOG": str(machine / "log"),
        "BIN": str(machine / "bin"),
        "STATE": str(machine / "state"),
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], env=environ, stdin=stdin, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def log(machine: Path) -> list[str]:
    """What the script did, without its read-only probes (sudo -n true, sudo -n docker info)."""
    path = machine / "log"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line for line in lines if not line.startswith("sudo -n ")]


def test_root_in_ci_installs_and_starts_docker(machine):
    done = run(machine, 0)
    assert done.returncode == 0, done.stderr
    lines = log(machine)
    install = next(line for line in lines if line.startswith("apt-get install"))
    assert install.split()[-4:] == list(("docker.io", "debootstrap", "openssh-client", "rsync"))
    assert "dockerd" in lines and not any(line.startswith("sudo") for line in lines)
    assert "bootstrap: ready: Docker Engine 20.10.24" in done.stdout


def test_a_ready_machine_is_left_alone(machine):
    for name, body in INSTALLED.items():
        (machine / "bin" / name).write_text("#!/bin/sh\n" + body)
        (machine / "bin" / name).chmod(0o755)
    (machine / "state" / "daemon").touch()
    done = run(machine, 1000)
    assert done.returncode == 0, done.stderr
    assert log(machine) == [] and done.stdout == ""


def test_without_root_off_a_terminal_it_says_what_to_run(machine):
    done = run(machine, 1000)
    assert done.returncode == 1
    assert "install docker.io debootstrap openssh-client rsync with apt-get" in done.stderr
    assert "run tools/bootstrap.sh in a terminal" in done.stderr
    assert log(machine) == [], "nothing may change without asking"


@pytest.mark.parametrize(("answer", "code"), [("y\n", 0), ("n\n", 1)])
def test_without_root_on_a_terminal_it_asks_before_sudo(machine, answer, code):
    primary, secondary = os.openpty()
    os.write(primary, answer.encode())
    try:
        done = run(machine, 1000, stdin=secondary)
    finally:
        os.close(primary)
        os.close(secondary)
    assert done.returncode == code, done.stderr
    if code == 0:
        assert any(line.startswith("sudo env DEBIAN_FRONTEND") for line in log(machine))
        assert "dockerd" in log(machine)
    else:
        assert log(machine) == [] and "nothing changed" in done.stderr


def test_a_daemon_only_root_may_use_is_named(machine):
    for name, body in INSTALLED.items():
        (machine / "bin" / name).write_text("#!/bin/sh\n" + body)
        (machine / "bin" / name).chmod(0o755)
    # The daemon answers root (through sudo) only.
    (machine / "bin" / "docker").write_text('#!/bin/sh\n[ "$1" = info ] && [ -n "$AS_ROOT" ]\n')
    (machine / "bin" / "sudo").write_text(
        '#!/bin/sh\n[ "$1" = -n ] && shift\nAS_ROOT=1 exec "$@"\n'
    )
    done = run(machine, 1000)
    assert done.returncode == 1
    assert "may not use it: add the account to the docker group" in done.stderr
