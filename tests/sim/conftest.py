"""Fixtures for tests that run against the simulated pair (make sim-up first)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import testinfra

ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventories" / "sim"
# The Ansible of the interpreter running the tests (the project venv).
ANSIBLE_BIN = Path(sys.executable).parent
# The owner's sudo asks for a password on the sim nodes, as on DGX OS: every run is given the
# sim's vault password, which opens the inventory's vaulted ansible_become_password.
os.environ.setdefault("ANSIBLE_VAULT_PASSWORD_FILE", str(INVENTORY / "vault-password"))


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


simctl = _load("simctl", ROOT / "sim" / "simctl.py")
# The modules simctl imported from sim/ (one copy each: what a test changes reaches simctl).
sim_common = importlib.import_module("sim_common")
sim_images = importlib.import_module("sim_images")
# The fault drills (benchmarks/drills.py), shared by the recovery and serving tests.
drills = _load("drills", ROOT / "benchmarks" / "drills.py")
sim_test_runs = _load("sim_test_runs", ROOT / "tools" / "sim_test_runs.py")

# Every Ansible run of the session, a JSON line each (which test, what ran, its seconds and
# tasks): tools/sim_test_runs.py reads it, and the session's summary prints what it says.
RUNS_LOG = ROOT / sim_test_runs.DEFAULT_LOG


def _log_run(argv: list[str], started: float, seconds: float, rc: int, report) -> None:
    test, _, phase = os.environ.get("PYTEST_CURRENT_TEST", "? (?)").rpartition(" (")
    tasks = ran = None
    if isinstance(report, dict):
        done = [t for play in report.get("plays", []) for t in play["tasks"]]
        tasks = len(done)
        ran = sum(not r.get("skipped") for t in done for r in t["hosts"].values())
    elif isinstance(report, str):
        tasks = report.count("\nTASK [")
    entry = {"test": test.removeprefix("tests/sim/"), "phase": phase.rstrip(")"),
             "argv": sim_test_runs.masked(argv),
             "start": round(started, 1), "seconds": round(seconds, 1), "rc": rc, "tasks": tasks,
             "ran": ran}  # fmt: skip
    with RUNS_LOG.open("a", encoding="utf-8") as log:
        log.write(json.dumps(entry) + "\n")


# Set once this session has started its own log: the summary never reads an older session's.
_RUNS_LOGGED: list[bool] = []


@pytest.fixture(scope="session", autouse=True)
def _runs_log():
    """A new log of Ansible runs for each session (before any test runs Ansible), closed with
    the session's end."""
    _RUNS_LOGGED.append(True)
    RUNS_LOG.parent.mkdir(exist_ok=True)
    RUNS_LOG.write_text(json.dumps({"session": round(time.time(), 1)}) + "\n", encoding="utf-8")
    yield
    with RUNS_LOG.open("a", encoding="utf-8") as log:
        log.write(json.dumps({"ended": round(time.time(), 1)}) + "\n")


def pytest_terminal_summary(terminalreporter) -> None:
    if _RUNS_LOGGED:
        session, ended, runs = sim_test_runs.read_log(RUNS_LOG.read_text(encoding="utf-8"))
        terminalreporter.section("Ansible runs of the sim tests (tools/sim_test_runs.py)")
        terminalreporter.write_line(
            sim_test_runs.summary(session, runs, now=ended or time.time(), top=10)
        )


# The order `make test` runs the modules in, for speed only: every module takes the pair from
# what it finds (deployed_pair / serving_pair run deploy.yml, a no-op when the pair is as the
# last converge left it, and otherwise a converge), so no module needs another to run before
# it; tools/sim_alone.py runs each module alone, in a shuffled order, to show it. This order
# only saves whole runs: read-only checks and refusals first (host_prep.yml before any deploy
# of the tests'), the stages' own tests while the pair is still as the last converge left it,
# and the modules that leave it otherwise later, each next to one that repairs it anyway
# (test_firewall's rank drill restarts
# a container, test_serving ends on a rotated key, test_monitoring records its own settings,
# test_upgrade ends on the test's donor), and test_teardown last: it takes the pair as it
# serves and removes the deployment, which no module after it then deploys again.
MODULE_ORDER = (
    "test_pair", "test_tiny_model", "test_vllm_registry_info", "test_host_prep",
    "test_image_inputs", "test_image_report", "test_model_cache", "test_chat", "test_weights",
    "test_first_start", "test_collective", "test_nccl_choice", "test_operate", "test_soak",
    "test_profiles", "test_rerun", "test_check_mode", "test_container_settings", "test_firewall",
    "test_monitoring", "test_recovery", "test_watchdog_busy", "test_serving", "test_upgrade",
    "test_teardown",
)  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "drill: a fault drill, a failed start's rollback (each a restart or two of the group), "
        "or a check whose logic the unit tests hold and whose run here is minutes of load on "
        "the sim's CPU; `make test` leaves them out, `make test-drills` runs them",
    )


def pytest_collection_modifyitems(items):
    """Runs the modules in MODULE_ORDER (a module not listed runs first, in file order)."""

    def rank(item) -> int:
        name = Path(str(item.fspath)).stem
        return MODULE_ORDER.index(name) + 1 if name in MODULE_ORDER else 0

    items.sort(key=rank)


@pytest.fixture(scope="session")
def sim():
    """The sim's own description of the pair; fails when the pair is not up."""
    nodes = simctl.read_nodes()
    for node in nodes:
        state = simctl.container_state(node.container)
        if not state or not state["State"]["Running"]:
            pytest.fail(f"{node.name} is not running: run `make sim-up` first")
    return simctl


@pytest.fixture(scope="session")
def nodes(sim):
    return sim.read_nodes()


@pytest.fixture(scope="session")
def images(sim):
    """The sim's images (sim/sim_images.py): their names, the pinned versions, the tiny model."""
    return sim_images


@pytest.fixture(scope="session")
def hosts(sim, nodes):
    """testinfra hosts as root on each node (docker exec into the node container): what the
    tests look at or stage. The collection itself reaches the nodes over SSH as the owner,
    whose sudo asks for a password."""
    return {n.name: testinfra.get_host(f"docker://{n.container}") for n in nodes}


@pytest.fixture(scope="session")
def owner_hosts(sim, nodes):
    """testinfra hosts over real SSH as the owner, with the key and host keys sim-up wrote."""
    config = sim.STATE / "ssh" / "config"
    return {n.name: testinfra.get_host(f"ssh://{n.name}", ssh_config=str(config)) for n in nodes}


def run_ansible(pattern: str, module: str, args: str = "", *extra: str) -> dict[str, dict]:
    """An ad-hoc Ansible run against the sim inventory; returns each host's result."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
    }
    cmd = [str(ANSIBLE_BIN / "ansible"), pattern, "-i", str(INVENTORY), "-m", module, *extra]
    if args:
        cmd += ["-a", args]
    started, clock = time.time(), time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, text=True, capture_output=True, check=False)
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        report = None
    _log_run([pattern, "-m", module, *extra], started, time.monotonic() - clock,
             proc.returncode, report)  # fmt: skip
    if report is None:
        pytest.fail(
            f"ansible printed no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return {
        host: res
        for play in report["plays"]
        for task in play["tasks"]
        for host, res in task["hosts"].items()
    }


@pytest.fixture(scope="session")
def ansible():
    return run_ansible


class PlaybookRun:
    """One ansible-playbook run: rc, seconds and its output; with the JSON callback (the
    default) also its report, read through stats and results."""

    def __init__(self, proc: subprocess.CompletedProcess, seconds: float, json_report: bool = True):
        self.rc = proc.returncode
        self.seconds = seconds
        self.stdout = proc.stdout
        self.raw = proc.stdout + proc.stderr
        self.report: dict | None = None
        if not json_report:
            return
        try:
            self.report = json.loads(proc.stdout)
        except json.JSONDecodeError:
            pytest.fail(f"ansible-playbook printed no JSON (rc {self.rc}):\n{self.raw[-4000:]}")

    @property
    def stats(self) -> dict[str, dict]:
        return self.report["stats"]

    def results(self):
        """(task name without the role prefix, host, result) for every task and host."""
        for play in self.report["plays"]:
            for task in play["tasks"]:
                name = task["task"]["name"].split(" : ", 1)[-1]
                for host, res in task["hosts"].items():
                    yield name, host, res

    def failures(self) -> list[str]:
        return [f"{h}: {r.get('msg')}" for _n, h, r in self.results() if r.get("failed")]

    def changed(self) -> dict[str, int]:
        return {host: s["changed"] for host, s in self.stats.items()}

    def changed_tasks(self) -> list[str]:
        """'host: task' for every task that reported a change (for assertion messages)."""
        return [f"{h}: {n}" for n, h, r in self.results() if r.get("changed")]

    def noop_report(self, required: bool = True) -> str:
        """What the no-op check (the converge role, playbooks/noop.yml) said: one sentence on a
        no-op, else the opening line and one line per reason. A run that said nothing fails the
        test, unless not required ('' then)."""
        said = [r.get("msg", "") for name, _h, r in self.results() if name == NOOP_TASK]
        assert said or not required, f"the no-op check said nothing:\n{self.raw[-3000:]}"
        return "" if not said else said[0] if isinstance(said[0], str) else "\n".join(said[0])

    def messages(self) -> str:
        """Every task's message, loop items' too, one per line."""
        out = []
        for _name, _host, res in self.results():
            out.append(str(res.get("msg", "")))
            for item in res.get("results", []) or []:
                if isinstance(item, dict):
                    out.append(str(item.get("msg", "")))
        return "\n".join(out)


def run_playbook(
    path: str, *extra: str, json_report: bool = True, timeout: float | None = None
) -> PlaybookRun:
    """ansible-playbook PATH -i inventories/sim EXTRA..., from the repository root. With
    json_report=False the output is ansible.cfg's own callback, the text a user reads."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
    if json_report:
        env |= {
            "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.json",
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
        }
    cmd = [str(ANSIBLE_BIN / "ansible-playbook"), path, "-i", str(INVENTORY), *extra]
    started, clock = time.time(), time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, text=True, capture_output=True, timeout=timeout, check=False
    )
    seconds = time.monotonic() - clock
    try:
        run = PlaybookRun(proc, seconds, json_report)
    except BaseException:  # no JSON: pytest.fail, logged first
        _log_run([path, *extra], started, seconds, proc.returncode, None)
        raise
    _log_run([path, *extra], started, seconds, run.rc, run.report if json_report else run.stdout)
    return run


def playbook_report(path: str, *extra: str) -> dict:
    """The JSON callback's report of run_playbook(PATH, EXTRA...), with its rc and seconds."""
    run = run_playbook(path, *extra)
    return {**run.report, "rc": run.rc, "seconds": round(run.seconds)}


@pytest.fixture(scope="session")
def playbook():
    return run_playbook


def _answers(nodes, key: str | None = None) -> bool:
    """One token from the endpoint with ``key``, the inventory's by default."""
    import yaml

    serve = yaml.safe_load((INVENTORY / "group_vars/all/serve.yml").read_text())
    endpoint = drills.endpoint(
        f"http://{nodes[0].mgmt_ip}:8000", key or serve["vllm_serve_api_key"], timeout=30
    )
    return endpoint.complete(drills.SERVED_MODEL, "spark").ok


# The no-op check's report task (roles/converge/tasks/main.yml), and how it opens on a no-op
# and on a converge.
NOOP_TASK = "Say why this run is a no-op or a converge"
NOOP = "No-op:"
CONVERGE = "Converge: every stage runs, because"


# Where the modules' own deploy.yml runs say why they converged (or that the run was a no-op):
# a converge costs a minute or more, and `make test` shows no passing test's output.
DEPLOYS_LOG = ROOT / ".cache" / "sim-test-deploys.log"


def converge(who: str, nodes, *extra: str, key: str | None = None) -> None:
    """deploy.yml with the inventory and EXTRA, as an owner runs it: a no-op (seconds) when
    the pair is as the last converge with these settings left it, else a converge (a full
    deploy on a fresh pair, or a repair of what ran before: a restarted container, other
    settings, a torn-down pair); then one token with ``key`` (the inventory's by default). Its
    seconds and the no-op check's words go to DEPLOYS_LOG under who.

    deploy.yml's no-op check is asked first on its own (playbooks/noop.yml, the play deploy.yml
    opens with): where it says no-op, deploy.yml would end there, and is not run. That costs
    3 s against deploy.yml's 9 s (it loads every stage's roles before its first play), at the
    start of most modules; test_rerun runs deploy.yml's own no-op."""
    path = "playbooks/noop.yml"
    run = run_playbook(path, *extra)
    if run.rc != 0 or not run.noop_report(required=False).startswith(NOOP):
        path = "deploy.yml"
        run = run_playbook(path, *extra)
    assert run.rc == 0, run.failures() or run.raw[-4000:]
    said = run.noop_report().replace("\n", "\n  ")
    line = f"{who}: {path} {run.seconds:.0f}s: {said}"
    print(f"\n{line}")
    DEPLOYS_LOG.parent.mkdir(exist_ok=True)
    with DEPLOYS_LOG.open("a", encoding="utf-8") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
    assert _answers(nodes, key), "the pair does not serve after deploy.yml"


@pytest.fixture(scope="module")
def deployed_pair(request, sim, nodes):
    """The pair serving the inventory's deployment, for each module that needs it whatever ran
    before (converge)."""
    converge(request.module.__name__, nodes)
    return nodes


@pytest.fixture(scope="module")
def pair_with_images(request, sim, nodes):
    """The pair answering with the inventory's key and the serving alias on every node, whatever
    images stage record an earlier module left (test_profiles' older base, images.yml run
    with other names): for the modules that run the images stage themselves and need no more
    of the pair. deploy.yml (converge) only where a node lacks the alias or the pair does not
    answer; the next module that needs the pair as the inventory has it converges it."""
    alias = "dgx-spark/vllm-serving:current"
    if all(on_node(n, "docker", "image", "inspect", alias, check=False).returncode == 0
           for n in nodes) and _answers(nodes):  # fmt: skip
        return nodes
    converge(request.module.__name__, nodes)
    return nodes


@pytest.fixture(scope="module")
def serving_pair(deployed_pair):
    """The pair serving the inventory's deployment, as deployed_pair leaves it: deploy.yml's
    in-step check, and its repair of whatever an earlier module left out of step (a restarted
    container, other settings recorded, a rotated key, a torn-down pair)."""
    return deployed_pair


def on_node(node, *argv: str, check: bool = True, data: bytes | None = None):
    """ARGV as root on a node (docker exec into its container: the owner's sudo asks for a
    password). With ``data``, it is the command's standard input and the output stays bytes."""
    cmd = [sim_common.DOCKER, "exec", *(["-i"] if data is not None else []), node.container, *argv]
    return subprocess.run(cmd, input=data, capture_output=True, text=data is None, check=check)


def node_image_store(node) -> str:
    """'containerd' when the node's Docker keeps images in the containerd image store, else
    'classic' (DGXSIM_IMAGE_STORE at sim-up)."""
    status = on_node(node, "docker", "info", "--format", "{{json .DriverStatus}}").stdout
    return "containerd" if "io.containerd.snapshotter" in status else "classic"


def _tar(members: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive.getvalue()


def load_changed_image(nodes, source: str, target: str, labels: dict, env: list[str] = ()) -> str:
    """Give every node one new image under ``target``: ``source``'s layers with other labels
    (and environment), as a ``docker pull`` of a new release under the same tag would. The
    image is a new configuration over layers every node already has, so its ID is the same on
    every node and ``docker load`` reads no layer: in the classic store a docker-save archive
    without layers (the ID is the configuration's digest), in the containerd store an OCI
    archive without layer blobs (the ID is the manifest's digest; the manifest comes from the
    node's containerd). Its creation time is now's, so no earlier call gave the same ID: with a
    fixed one, test_upgrade run alone right after `make test` loaded the donor the serving
    alias was already built from, and the images stage rightly had nothing to rebuild."""
    import hashlib

    def sha(raw: bytes) -> str:
        return hashlib.sha256(raw).hexdigest()

    now = time.time_ns()
    when = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now // 10**9)) + f".{now % 10**9:09d}Z"
    history = {"created": when, "comment": "dgx_spark.cluster sim test: " + json.dumps(labels)}

    def changed(config: dict) -> dict:
        return {
            **config,
            "Labels": {**(config.get("Labels") or {}), **labels},
            "Env": [*(config.get("Env") or []), *env],
        }

    if node_image_store(nodes[0]) == "containerd":
        ctr = ["ctr", "--address", "/run/docker/containerd/containerd.sock", "-n", "moby"]
        source_id = node_image_id(nodes[0], source)
        manifest = json.loads(on_node(nodes[0], *ctr, "content", "get", source_id).stdout)
        image = json.loads(
            on_node(nodes[0], *ctr, "content", "get", manifest["config"]["digest"]).stdout
        )
        image = {**image, "created": when, "config": changed(image["config"]),
                 "history": [*image.get("history", []), history]}  # fmt: skip
        raw_config = json.dumps(image, sort_keys=True).encode()
        manifest["config"] = {**manifest["config"], "digest": f"sha256:{sha(raw_config)}",
                              "size": len(raw_config)}  # fmt: skip
        raw_manifest = json.dumps(manifest, sort_keys=True).encode()
        name, tag = target.rsplit(":", 1)
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": manifest["mediaType"],
                "digest": f"sha256:{sha(raw_manifest)}",
                "size": len(raw_manifest),
                "annotations": {
                    "io.containerd.image.name": f"docker.io/library/{name}:{tag}"
                    if "/" not in name else f"docker.io/{name}:{tag}",
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        }  # fmt: skip
        archive = _tar({
            "oci-layout": b'{"imageLayoutVersion": "1.0.0"}',
            "index.json": json.dumps(index).encode(),
            f"blobs/sha256/{sha(raw_config)}": raw_config,
            f"blobs/sha256/{sha(raw_manifest)}": raw_manifest,
        })  # fmt: skip
        image_id = f"sha256:{sha(raw_manifest)}"
    else:
        attrs = json.loads(on_node(nodes[0], "docker", "image", "inspect", source).stdout)[0]
        image = {
            "architecture": attrs["Architecture"],
            "os": attrs["Os"],
            "created": when,
            "config": changed(dict(attrs["Config"])),
            "rootfs": {"type": "layers", "diff_ids": attrs["RootFS"]["Layers"]},
            "history": [history],
        }
        raw = json.dumps(image, sort_keys=True).encode()
        layers = [f"{d.split(':', 1)[1]}/layer.tar" for d in attrs["RootFS"]["Layers"]]
        manifest = [{"Config": f"{sha(raw)}.json", "RepoTags": [target], "Layers": layers}]
        archive = _tar({f"{sha(raw)}.json": raw, "manifest.json": json.dumps(manifest).encode()})
        image_id = f"sha256:{sha(raw)}"
    for node in nodes:
        on_node(node, "docker", "load", data=archive)
    return image_id


def node_image_id(node, ref: str) -> str:
    """The ID behind ``ref`` on a node ('' when it has none)."""
    got = on_node(node, "docker", "image", "inspect", "--format", "{{.Id}}", ref, check=False)
    return got.stdout.strip() if got.returncode == 0 else ""
