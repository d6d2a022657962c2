"""The serving stage on the running pair: the key on every route, secrets kept out of sight,
and the ranks restarted as one group when a key rotates or the ranks fall out of step; what
the serving image's vLLM refuses before any start touches no container (a start that does not
serve is rolled back: test_first_start, test_upgrade and test_weights); the multinode backend
stays selectable, and its watchdogs bring back a head rank that restarted alone.

Needs the pair serving with the inventory's key (deployed first when it does not answer). Each
test leaves the pair serving; the module ends on the rotated key, out of step with the record:
the module after it (test_upgrade) makes a whole run of deploy.yml anyway, which brings the
inventory's key back.
"""

from __future__ import annotations

import json
import re
import shlex
import threading
import time

import pytest
import yaml
from conftest import ROOT, drills, run_playbook

SERVE = yaml.safe_load((ROOT / "inventories/sim/group_vars/all/serve.yml").read_text())
KEY = SERVE["vllm_serve_api_key"]
MODEL = drills.SERVED_MODEL
ROTATED = "rotated-sim-key-0123"
WAIT_TASK = "Wait until the pair serves, showing the start's progress"
# vllm_serve's collective (tasks/collective.yml, test_collective.py): its decision, and each
# node's stamp of the last pass.
COLLECTIVE_DECIDED = "Say whether the collective runs"
COLLECTIVE_STAMP = "/var/lib/dgx-spark/stamps/collective.json"
ROLLBACK_WAIT_TASK = "Wait until the previous configuration serves again, showing its progress"


def base_url(nodes) -> str:
    return f"http://{nodes[0].mgmt_ip}:8000"


def endpoint(nodes, key: str | None = None, timeout: float = 30):
    """The collection's client of the head's endpoint, asking with ``key`` (None: none)."""
    return drills.endpoint(base_url(nodes), key or "", timeout)


def complete(nodes, key: str, timeout: float = 30, model: str = MODEL) -> bool:
    return endpoint(nodes, key, timeout).complete(model, "spark").ok


class Client(threading.Thread):
    """Asks for one token every PERIOD seconds with any of the keys (of any of the models, the
    inventory's by default); records when it worked, so a gap is known to within PERIOD."""

    # An answer costs the sim's CPU vLLM about half a second of a core: asked every half
    # second, the client kept 47 % of the machine's two cores busy (9 % without it), taken
    # from the run it watched (test_profiles' way back: 235 s under it, 146 s without).
    PERIOD = 2.0

    def __init__(self, nodes, keys: list[str], models: tuple[str, ...] = (MODEL,),
                 period: float | None = None):  # fmt: skip
        super().__init__(daemon=True)
        self.nodes, self.keys, self.models = nodes, keys, models
        self.period = self.PERIOD if period is None else period
        self.ok: list[float] = []
        self.failed = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            if any(complete(self.nodes, key, timeout=10, model=model)
                   for key in self.keys for model in self.models):  # fmt: skip
                self.ok.append(time.monotonic())
            else:
                self.failed += 1
            time.sleep(self.period)

    def longest_gap(self) -> float:
        gaps = [b - a for a, b in zip(self.ok, self.ok[1:], strict=False)]
        return max(gaps, default=float("inf"))

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(timeout=30)


def vllm_start_seconds(run) -> float:
    """How long the restarted group took to serve, as the serving role measured it."""
    waits = [r for name, _h, r in run.results() if name == WAIT_TASK and "seconds" in r]
    assert waits, "the run restarted nothing"
    return waits[-1]["seconds"]


def serve(*extra: str):
    """The serving stage alone, as an owner reruns it (deploy.yml --tags serve runs the same
    plays after the settings and preflight: test_rerun's tagged run covers that path)."""
    return run_playbook("playbooks/serve.yml", *extra)


@pytest.fixture(scope="module")
def deployed(serving_pair, nodes):
    """The pair serving with the inventory's key, whatever the record says."""
    return nodes


def sh(host, command: str) -> str:
    result = host.run(f"sudo sh -c {shlex.quote(command)}")
    assert result.rc == 0, result.stderr
    return result.stdout


def routes(host) -> list[tuple[str, str]]:
    """(path, method) of every route the serving vLLM logged at start."""
    found = {}
    for line in sh(host, "docker logs dgx-spark-vllm 2>&1").splitlines():
        match = re.search(r"Route: (\S+), Methods: ([A-Z, ]+)", line)
        if match and "{" not in match.group(1):
            methods = [m.strip() for m in match.group(2).split(",")]
            found[match.group(1)] = "GET" if "GET" in methods else methods[0]
    return sorted(found.items())


def test_every_route_but_health_needs_the_key(deployed, hosts, nodes):
    table = []
    for path, method in routes(hosts["spark-1"]):
        body = {} if method == "POST" else None
        without, _ = endpoint(nodes).request(path, body, method=method)
        with_key, _ = endpoint(nodes, KEY).request(path, body, method=method)
        table.append((path, method, without, with_key))
    print("\nroute, method, status without the key, status with it")
    for row in table:
        print(*row, sep="\t")
    assert len(table) >= 20, table
    assert all(w == 401 for p, _m, w, _k in table if p != "/health"), table
    assert all(k != 401 for _p, _m, _w, k in table), table
    assert [w for p, _m, w, _k in table if p == "/health"] == [200]


def test_secrets_stay_out_of_arguments_environments_and_inspect(deployed, hosts):
    token = sh(hosts["spark-1"], "cat /etc/dgx-spark/ray/token").strip()
    assert len(token) >= 32
    for name, host in hosts.items():
        # Every process of the node (the containers' included): arguments and environment.
        seen = sh(host, "cat /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null || true")
        inspect = sh(host, "docker inspect $(docker ps -aq)")
        for secret in (KEY, token):
            assert secret not in seen, f"{name}: a secret in a process's arguments or environment"
            assert secret not in inspect, f"{name}: a secret in docker inspect"
        assert "RayWorkerProc" in sh(host, "docker top dgx-spark-ray -eo pid,args"), name
        modes = sh(host, "stat -c '%a %n' /etc/dgx-spark/ray /etc/dgx-spark/ray/token "
                         "/var/lib/dgx-spark/ray")  # fmt: skip
        assert modes.split()[::2] == ["700", "600", "700"], modes
    auth = sh(hosts["spark-1"], "stat -c '%a' /etc/dgx-spark/vllm /etc/dgx-spark/vllm/*/auth.json")
    assert auth.split() == ["700", "600"]


@pytest.mark.drill
def test_a_rerun_repairs_ranks_out_of_step(deployed, hosts, nodes):
    # The worker's rank freezes: every container still runs, the pair answers nothing. The
    # head's watchdog would repair this by itself (test_recovery.py): here the rerun must.
    sh(hosts["spark-1"], "docker stop dgx-spark-watchdog")
    pid = sh(hosts["spark-2"], "pgrep -f 'ray::RayWorkerProc' | head -1").strip()
    sh(hosts["spark-2"], f"kill -STOP {pid}")
    assert not complete(nodes, KEY, timeout=10)
    started = time.monotonic()
    # The rerun's one-token question waits 5 s instead of the default 30 (plan.yml alone reads
    # it): the frozen rank never answers, however long it is given.
    run = serve("-e", "vllm_serve_probe_timeout=5")
    seconds = time.monotonic() - started
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    reasons = [r.get("msg", "") for name, _h, r in run.results()
               if name == "Say why the serving group restarts"]  # fmt: skip
    assert reasons and "did not serve" in reasons[0], reasons
    assert complete(nodes, KEY)
    print(f"\nout of step: the rerun served again in {seconds:.0f}s "
          f"(vLLM start {vllm_start_seconds(run):.0f}s)")  # fmt: skip


def key_left_behind(host, key: str) -> list[str]:
    """Where a node still holds ``key``: the collection's files (the weights aside) and every
    container's configuration."""
    files = sh(host, f"grep -rlsF -- {shlex.quote(key)} /etc/dgx-spark /var/lib/dgx-spark "
                     "--exclude-dir=models || true").split()  # fmt: skip
    ids = sh(host, "docker ps -aq").split()
    inspect = sh(host, f"docker inspect {' '.join(ids)}") if ids else ""
    return files + [f"docker inspect of {len(ids)} containers"] * (key in inspect)


def test_a_key_rotation_restarts_the_group_once(deployed, nodes, hosts):
    # What a run under the multinode backend leaves on the worker, which under the Ray
    # backend serves from no configuration of its own: a configuration with the old key.
    left = "/etc/dgx-spark/vllm/0123456789abcdef"
    plant = f"mkdir -p -m 0700 {left} && printf %s {shlex.quote(KEY)} > {left}/auth.json"
    sh(hosts["spark-2"], plant)
    stamps = {name: sh(host, f"cat {COLLECTIVE_STAMP}") for name, host in hosts.items()}
    with Client(nodes, [KEY, ROTATED]) as client:
        time.sleep(2)
        run = serve("-e", f"vllm_serve_api_key={ROTATED}")
        time.sleep(3)
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    assert complete(nodes, ROTATED) and not complete(nodes, KEY)
    # The key is no comm setting: the collective's stamps hold, so it is not run again.
    decided = [str(r.get("msg", "")) for n, _h, r in run.results() if n == COLLECTIVE_DECIDED]
    assert decided and "skipped (spark-1: skipped: collective passed " in decided[0], decided
    assert {name: sh(host, f"cat {COLLECTIVE_STAMP}") for name, host in hosts.items()} == stamps
    start = vllm_start_seconds(run)
    gap = client.longest_gap()
    print(f"\nkey rotation: downtime {gap:.0f}s, vLLM start {start:.0f}s, "
          f"{client.failed} failed requests, run {run.seconds:.0f}s")  # fmt: skip
    assert gap <= start + 15, (gap, start)
    # The old key is gone from every node: no older configuration, no container keeps it.
    # (The search does find the key in use, in the head's configuration.)
    assert key_left_behind(hosts["spark-1"], ROTATED), "the search finds not even the new key"
    for name, host in hosts.items():
        assert key_left_behind(host, KEY) == [], name


def test_what_the_images_vllm_refuses_touches_no_container(deployed, hosts, nodes):
    inspect = "docker inspect -f '{{.State.StartedAt}}' dgx-spark-vllm"
    started = sh(hosts["spark-1"], inspect)
    # Under the Ray backend a worker holds no configuration unless an earlier multinode run
    # left one: a missing directory lists as nothing, and must stay so.
    listing = "ls /etc/dgx-spark/vllm 2>/dev/null || true"
    configurations = {name: sh(host, listing) for name, host in hosts.items()}
    extra = json.dumps({"vllm_serve_reasoning_parser": "no_such_reasoner",
                        "vllm_serve_extra_args": SERVE["vllm_serve_extra_args"]
                        + ["--seed", "abc"]})  # fmt: skip
    # Either key: after the rollback test the pair serves with the rotated one.
    with Client(nodes, [KEY, ROTATED]) as client:
        run = serve("-e", extra)
        time.sleep(1.5)
    assert run.rc != 0
    message = " ".join(run.failures())
    # Both refusals in one message, each naming its setting and quoting vLLM.
    assert "vllm_serve_reasoning_parser (--reasoning-parser): vLLM 0.32.0" in message, message
    assert "has no reasoning parser 'no_such_reasoner'" in message, message
    quoted = "vllm_serve_extra_args (--seed): argument --seed: invalid int value"
    assert f"{quoted}: 'abc'" in message, message
    ran = {name for name, _h, r in run.results() if not r.get("skipped")}
    assert "Stop the running ranks" not in ran and "Pause the watchdogs" not in ran
    assert sh(hosts["spark-1"], inspect) == started
    # Nothing written either: no new configuration's directory, launcher or key.
    assert run.changed()["spark-1"] == run.changed()["spark-2"] == 0, run.changed_tasks()
    after = {name: sh(host, listing) for name, host in hosts.items()}
    assert after == configurations
    print(f"\nrefused by the image's vLLM: run {run.seconds:.0f}s, longest gap "
          f"{client.longest_gap():.1f}s, {client.failed} failed requests")  # fmt: skip
    assert client.failed == 0 and client.longest_gap() < 5


@pytest.mark.drill
def test_the_multinode_backend_stays_selectable_and_heals_a_head_rank(deployed, hosts, nodes):
    run = serve("-e", "vllm_serve_backend=multinode")
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    assert complete(nodes, KEY)
    for rank, name in enumerate(["spark-1", "spark-2"]):
        top = sh(hosts[name], "docker top dgx-spark-vllm -eo pid,args")
        assert f"--node-rank {rank}" in top, top
        watchdog = sh(hosts[name], "docker inspect -f '{{.State.Status}}' dgx-spark-watchdog")
        assert watchdog.strip() == "running", (name, watchdog)
    # The fault that needed a human before: the head's rank restarts alone and waits for a
    # worker rank still held by the old group; the worker's watchdog must release it.
    result = drills.drill("head-rank", nodes[0], nodes[1], timeout=600)
    print(f"\nmultinode head-rank: {result}")
    assert result["recovered"], result
    started = vllm_start_seconds(run)
    # The worker's watchdog first misses 3 probes (10 s apart on the sim), its rank gets
    # 30 s to stop, then one start of the group.
    assert result["seconds"] <= started + 3 * 10 + 30 + 60, (result, started)
