"""The page-cache drop while the ranks load (roles/vllm_serve/tasks/run.yml, hardware only),
evaluated by Ansible's own templating: the decision agrees with
spark_memory.page_cache_drop_during_load on every version the module's tests name, and the
background loop drops while its flag exists and stops when the flag goes or the deadline
passes."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.dgx_spark.cluster.plugins.module_utils import spark_memory as sm

ROOT = Path(__file__).resolve().parents[3]
ROLE = ROOT / "roles" / "vllm_serve"
RUN = DataLoader().load_from_file(str(ROLE / "tasks/run.yml"), trusted_as_template=True)
VALIDATE = DataLoader().load_from_file(str(ROLE / "tasks/validate.yml"), trusted_as_template=True)
DEFAULTS = DataLoader().load_from_file(str(ROLE / "defaults/main.yml"), trusted_as_template=True)
DROP_CACHES = "/proc/sys/vm/drop_caches"


def _tasks(tasks):
    for task in tasks:
        yield task
        yield from _tasks(task.get("block", []))


def _task(name: str, tasks=RUN) -> dict:
    (task,) = [t for t in _tasks(tasks) if t.get("name") == name]
    return task


RESTART = _task("Restart the serving group")
DECIDE = _task("Decide whether the page cache is dropped while the ranks load")
LOOP = _task("Drop the page cache every few seconds while the ranks load")


def decide(mode: str, loader_version=None, probed_version=None) -> tuple[bool, str]:
    """(drop, version) as the set_fact computes them, after load_format.yml's probe (when the
    loader is auto) or run.yml's own."""
    scope = {**DEFAULTS, **RESTART["vars"], **DECIDE["vars"], "vllm_serve_drop_page_cache": mode}
    if loader_version is not None:
        scope["_vllm_serve_loader_probe"] = {"versions": {"vllm": loader_version}}
    if probed_version is not None:
        scope["_vllm_serve_version_probe"] = {"versions": {"vllm": probed_version}}
    templar = Templar(loader=DataLoader(), variables=scope)
    facts = DECIDE["ansible.builtin.set_fact"]
    drop = templar.template(facts["_vllm_serve_load_drop"])
    version = templar.template(facts["_vllm_serve_load_drop_version"])
    return bool(drop), version


VERSIONS = [
    "0.10.0", "0.11.0", "0.11", "v0.11.0", "0.11.1rc1", "0.11.1.dev42+g1234abc",
    "0.1.dev16260+g388fd5153", "0.9.2+cu128", "0.11.1", "0.11.1.0", "0.11.1.post1",
    "0.11.1+cu130", "0.11.2", "0.12.0rc1", "0.14.1", "V0.14.1", "0.17.1rc1", "0.32.0+cpu",
    "1.0", " 0.14.1\n", "latest", "0.14.1-gb10", "0.x", "v", "0.14.1rc", "1!0.14.1",
]  # fmt: skip


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_the_role_decides_as_the_module(mode, version):
    expected, _ = sm.page_cache_drop_during_load(version, mode)
    assert decide(mode, loader_version=version) == (expected, version.strip())
    assert decide(mode, probed_version=version)[0] is expected


def test_an_unknown_version_drops_in_auto():
    assert decide("auto") == (True, "")
    assert decide("auto", loader_version="")[0] is True
    assert sm.page_cache_drop_during_load("")[0] is True


def test_the_loader_probe_is_read_first():
    assert decide("auto", loader_version="0.14.1", probed_version="0.10.0") == (False, "0.14.1")


def test_the_role_holds_the_module_boundary():
    assert DECIDE["vars"]["_as_free_since"] == ".".join(map(str, sm.PAGE_CACHE_AS_FREE_SINCE))
    # Dropped on Sparks until a capture shows what vLLM reads there (the default's comment).
    assert DEFAULTS["vllm_serve_drop_page_cache"] == "always"


def test_the_wiring_is_hardware_only_and_on_every_node():
    for name in (
        "Ask the serving image for its vLLM version",
        "Decide whether the page cache is dropped while the ranks load",
        "Mark the page-cache drop of this start as running",
        "Drop the page cache every few seconds while the ranks load",
        "Stop dropping the page cache",
    ):
        when = _task(name)["when"]
        conditions = when if isinstance(when, list) else [when]
        assert "spark_hardware | default(false) | bool" in conditions, name
    for name in (
        "Mark the page-cache drop of this start as running",
        "Stop dropping the page cache",
    ):
        assert "inventory_hostname in _vllm_serve_nodes" in _task(name)["when"], name
    # The loop runs in the background while the wait blocks, and the flag goes right after it.
    assert LOOP["poll"] == 0
    names = [t.get("name") for t in RESTART["block"]]
    wait = names.index("Wait until the pair serves, showing the start's progress")
    assert names.index("Drop the page cache every few seconds while the ranks load") < names.index(
        "Start every rank"
    )
    assert names[wait + 1] == "Stop dropping the page cache"


def loop_script(tmp_path: Path, timeout: int, every: int = 1) -> tuple[str, Path, Path]:
    """The loop's shell as the task renders it, writing to a file instead of the kernel's."""
    flag, target = tmp_path / "flag", tmp_path / "drop_caches"
    scope = {
        **DEFAULTS,
        "_vllm_serve_load_drop_flag": str(flag),
        "_vllm_serve_load_drop_every": every,
        "vllm_serve_health_timeout": timeout,
    }
    script = Templar(loader=DataLoader(), variables=scope).template(
        trust_as_template(LOOP["ansible.builtin.shell"])
    )
    assert DROP_CACHES in script
    # sync stays: it only flushes this machine's dirty pages.
    return script.replace(DROP_CACHES, str(target)), flag, target


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX shell")
def test_the_loop_drops_while_the_flag_exists_and_stops_when_it_goes(tmp_path):
    script, flag, target = loop_script(tmp_path, timeout=60)
    flag.touch()
    proc = subprocess.Popen(["sh", "-c", script])
    try:
        deadline = time.time() + 10
        while not target.exists() and time.time() < deadline:
            time.sleep(0.1)
        assert target.read_text() == "1\n"  # the page cache only: echo 1
        os.unlink(flag)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a POSIX shell")
def test_the_loop_ends_at_the_deadline_with_the_flag_left(tmp_path):
    script, flag, target = loop_script(tmp_path, timeout=2)
    flag.touch()
    started = time.time()
    assert subprocess.run(["sh", "-c", script], timeout=20).returncode == 0
    assert time.time() - started < 10
    assert target.read_text() == "1\n"
    assert flag.exists()


@pytest.mark.parametrize("mode", ["auto", "always", "never", "Auto", "", "yes"])
def test_validate_refuses_what_the_module_refuses(mode):
    task = _task("Check when the page cache is dropped while the ranks load", VALIDATE)
    templar = Templar(loader=DataLoader(), variables={"vllm_serve_drop_page_cache": mode})
    passed = templar.template(
        trust_as_template("{{ " + task["ansible.builtin.assert"]["that"] + " }}")
    )
    errors = sm.page_cache_setting_errors(mode)
    assert bool(passed) is (errors == [])
    if errors:
        message = templar.template(task["ansible.builtin.assert"]["fail_msg"])
        assert message == errors[0]
