"""model_cache on the simulated pair: playbooks/model.yml copies the tiny model once to the
head, pushes it to the worker over the fast link, verifies both, and does nothing the second
time. Each test uses a model_cache_dir of its own, removed before and after."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from conftest import on_node, playbook_report

BASE = "/var/lib/dgx-spark/test-model-cache"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SYNC_TASK = "Push the model from the head to the worker over the fast link"
FACTS_TASK = "Tell the serving roles where the model is and to stay offline"


def run_playbook(*extra: str, playbook: str = "playbooks/model.yml") -> dict:
    """ansible-playbook <playbook> -i inventories/sim, as the JSON callback reports it."""
    return playbook_report(playbook, *extra)


def results(report: dict, task_name: str) -> dict[str, dict]:
    return {
        host: res
        for play in report["plays"]
        for task in play["tasks"]
        if task["task"]["name"].split(" : ", 1)[-1] == task_name
        for host, res in task["hosts"].items()
    }


def failures(report: dict) -> list[str]:
    return [
        f"{host}: {task['task']['name']}: {res.get('msg')}"
        for play in report["plays"]
        for task in play["tasks"]
        for host, res in task["hosts"].items()
        if res.get("failed") or res.get("unreachable")
    ]


def changed(report: dict) -> dict[str, int]:
    return {host: stats["changed"] for host, stats in report["stats"].items()}


def sync_stats(report: dict, worker: str) -> dict:
    """Numbers from the --stats block rsync printed for one worker."""
    out = results(report, SYNC_TASK)[worker]["stdout"]
    stats = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep and value.strip().split(" ")[0].replace(",", "").isdigit():
            stats[key.strip()] = int(value.strip().split(" ")[0].replace(",", ""))
    return stats


def sha256_tree(top: Path) -> dict[str, str]:
    return {
        str(p.relative_to(top)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(top.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def node_files(host, directory: str) -> dict[str, tuple[str, str]]:
    """{name: (sha256, symlink target or "")} of a node directory's files, in one SSH call."""
    out = host.check_output(
        f"cd {directory} && for f in *; do "
        'printf "%s\\t%s\\t%s\\n" "$f" "$(sha256sum < "$f" | cut -d" " -f1)" "$(readlink "$f")"; '
        "done"
    )
    return {
        name: (digest, target)
        for name, digest, target in ((line.split("\t") + [""])[:3] for line in out.splitlines())
    }


def clean(hosts, path: str) -> None:
    for host in hosts.values():
        host.run(f"sudo rm -rf {path}")


@pytest.fixture(scope="module")
def tiny(images) -> Path:
    return Path(images.TINY_MODEL)


@pytest.fixture(scope="module", autouse=True)
def _clean_base(hosts):
    clean(hosts, BASE)
    yield
    clean(hosts, BASE)


@pytest.fixture(scope="module")
def first_run(hosts):
    report = run_playbook("-e", f"model_cache_dir={BASE}/plain")
    assert report["rc"] == 0, failures(report)
    return report


def test_first_run_puts_the_same_files_on_every_node(first_run, hosts, nodes, tiny):
    want = sha256_tree(tiny)
    assert want, f"{tiny} holds no model files"
    for name, host in hosts.items():
        got = node_files(host, f"{BASE}/plain/tiny-qwen3-moe")
        assert got == {rel: (digest, "") for rel, digest in want.items()}, name
    facts = results(first_run, FACTS_TASK)
    for node in nodes:
        assert (
            facts[node.name]["ansible_facts"]["model_cache_model_path"]
            == f"{BASE}/plain/tiny-qwen3-moe"
        )
        assert facts[node.name]["ansible_facts"]["model_cache_env"]["HF_HUB_OFFLINE"] == "1"


def test_first_run_pushes_over_the_fast_link(first_run, nodes):
    head, workers = nodes[0], nodes[1:]
    synced = results(first_run, SYNC_TASK)
    assert sorted(synced) == sorted(w.name for w in workers)
    for worker in workers:
        assert synced[worker.name]["changed"] is True
        assert any(
            str(arg).startswith(f"spark@{worker.fast_ip}:") for arg in synced[worker.name]["cmd"]
        )
        assert synced[worker.name]["cmd"][0] == "rsync"
        assert sync_stats(first_run, worker.name)["Literal data"] > 0
    assert head.name not in synced


HEAD_TASK = "Describe and check the head's copy"
WORKER_TASK = "Verify the worker's copy against the head's manifest"


def hashed(report: dict) -> dict[str, tuple[int, int]]:
    """(files read and checksummed, files vouched for by the record) per node; the head's
    check runs once, on the head, which is the first node."""
    return {
        host: (res["hashed"], res["reused"])
        for task in (HEAD_TASK, WORKER_TASK)
        for host, res in results(report, task).items()
        if "hashed" in res
    }


def weights_stamp(root: str) -> str:
    """The weights' stamp of a model directory (roles/model_cache/vars/main.yml)."""
    digest = hashlib.sha256(root.encode()).hexdigest()[:8]
    return f"/var/lib/dgx-spark/stamps/weights-{root.rsplit('/', 1)[-1]}-{digest}.json"


def test_first_placement_is_checksummed_and_recorded(first_run, hosts, nodes, tiny):
    files = len(sha256_tree(tiny))
    counts = sorted(hashed(first_run).values())
    assert counts == [(files, 0)] * len(nodes), counts
    for name, host in hosts.items():
        stamp = host.check_output(f"sudo cat {weights_stamp(f'{BASE}/plain/tiny-qwen3-moe')}")
        stamp = json.loads(stamp)
        assert stamp["inputs"]["model_dir"] == f"{BASE}/plain/tiny-qwen3-moe", name
        files = stamp["result"]["files"]
        assert sorted(files) == sorted(sha256_tree(tiny)), name
        assert all("sha256" in e and "mtime_ns" in e for e in files.values()), name


def test_rerun_changes_nothing_and_moves_zero_bytes(first_run, nodes, tiny):
    again = run_playbook("-e", f"model_cache_dir={BASE}/plain")
    assert again["rc"] == 0, failures(again)
    assert changed(again) == {"localhost": 0, **{n.name: 0 for n in nodes}}
    # Sizes and modification times only: nothing is read again.
    files = len(sha256_tree(tiny))
    assert sorted(hashed(again).values()) == [(0, files)] * len(nodes)
    for worker in nodes[1:]:
        stats = sync_stats(again, worker.name)
        assert stats["Literal data"] == 0, stats
        assert stats["Total transferred file size"] == 0, stats
        assert stats["Number of regular files transferred"] == 0, stats


def test_checksum_on_request_reads_every_file_again(first_run, nodes, tiny):
    asked = run_playbook("-e", f"model_cache_dir={BASE}/plain", "-e", "model_cache_verify=checksum")
    assert asked["rc"] == 0, failures(asked)
    # Nothing on the nodes changes: the stamp says the same files with the same checksums.
    assert changed(asked) == {"localhost": 0, **{n.name: 0 for n in nodes}}, changed(asked)
    files = len(sha256_tree(tiny))
    assert sorted(hashed(asked).values()) == [(files, 0)] * len(nodes)


def test_a_changed_file_is_read_again_and_caught(first_run, hosts, nodes, tiny):
    """Same size, other bytes, a new modification time on the worker: verification alone
    (no sync) reads that one file again and names it; a full run then puts it right."""
    worker = nodes[1].name
    path = f"{BASE}/plain/tiny-qwen3-moe/config.json"
    hosts[worker].check_output(
        "sudo python3 -c \"import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read()); "
        f"b[-1] = 32 if b[-1] != 32 else 10; open(p, 'wb').write(bytes(b))\" {path}"
    )
    files = len(sha256_tree(tiny))
    caught = run_playbook("-e", f"model_cache_dir={BASE}/plain", "--tags", "model_cache_verify")
    assert caught["rc"] != 0
    (message,) = failures(caught)
    assert message.startswith(f"{worker}: ") and "SHA-256 differs (1): config.json" in message
    assert hashed(caught)[worker] == (1, files - 1), hashed(caught)
    fixed = run_playbook("-e", f"model_cache_dir={BASE}/plain")
    assert fixed["rc"] == 0, failures(fixed)
    want = sha256_tree(tiny)["config.json"]
    assert node_files(hosts[worker], f"{BASE}/plain/tiny-qwen3-moe")["config.json"][0] == want


COPY_TASK = "Copy the local model directory to the head"


def test_the_source_is_copied_again_only_once_it_changed(hosts, nodes, tiny, tmp_path):
    """model_cache_local_dir is compared with the head's copy by size and time: a rerun leaves
    the copy alone (no file of either side is read), and a source file changed at the same size
    reaches the head and then the worker."""
    source = tmp_path / "tiny-qwen3-moe"
    shutil.copytree(tiny, source)
    given = ("-e", f"model_cache_dir={BASE}/from-source", "-e", f"model_cache_local_dir={source}")
    first = run_playbook(*given)
    assert first["rc"] == 0, failures(first)
    head = nodes[0].name
    assert results(first, COPY_TASK)[head].get("changed"), results(first, COPY_TASK)
    again = run_playbook(*given)
    assert again["rc"] == 0, failures(again)
    assert results(again, COPY_TASK)[head].get("skipped"), results(again, COPY_TASK)
    assert changed(again) == {"localhost": 0, **{n.name: 0 for n in nodes}}
    config = source / "config.json"
    text = bytearray(config.read_bytes())
    text[-1] = 32 if text[-1] != 32 else 10
    config.write_bytes(bytes(text))
    edited = run_playbook(*given)
    assert edited["rc"] == 0, failures(edited)
    assert results(edited, COPY_TASK)[head].get("changed"), results(edited, COPY_TASK)
    want = hashlib.sha256(bytes(text)).hexdigest()
    for node in nodes:
        files = node_files(hosts[node.name], f"{BASE}/from-source/tiny-qwen3-moe")
        assert files["config.json"][0] == want, (node.name, files["config.json"])


def test_model_bigger_than_memory_fails_before_any_change(hosts, nodes):
    target = f"{BASE}/too-big"
    report = run_playbook(
        "-e", f"model_cache_dir={target}", "-e", "model_cache_max_fraction_of_memory=0.0000001"
    )
    assert report["rc"] != 0
    (message,) = failures(report)
    assert "model_cache_max_fraction_of_memory" in message
    assert changed(report) == {"localhost": 0, **{n.name: 0 for n in nodes}}
    for name, host in hosts.items():
        assert not host.file(target).exists, f"{name}: {target} was made before the check failed"


@pytest.fixture(scope="module")
def hf_source(tmp_path_factory, tiny) -> Path:
    """A Hugging Face cache repository of the tiny model: blobs plus relative snapshot links."""
    repo = tmp_path_factory.mktemp("hub") / "models--sim--tiny-qwen3-moe"
    snapshot = repo / "snapshots" / COMMIT
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    for rel, digest in sha256_tree(tiny).items():
        shutil.copyfile(tiny / rel, repo / "blobs" / digest)
        (snapshot / rel).symlink_to(f"../../blobs/{digest}")
    return repo


def test_hf_cache_layout_survives_the_sync(hf_source, hosts, nodes, tiny):
    target = f"{BASE}/hf"
    report = run_playbook(
        "-e", f"model_cache_dir={target}", "-e", f"model_cache_local_dir={hf_source}"
    )
    assert report["rc"] == 0, failures(report)
    snapshot = f"{target}/{hf_source.name}/snapshots/{COMMIT}"
    for node in nodes:
        assert (
            results(report, FACTS_TASK)[node.name]["ansible_facts"]["model_cache_model_path"]
            == snapshot
        )
    # Each entry stays the same relative link and resolves to its blob on every node.
    want = {rel: (digest, f"../../blobs/{digest}") for rel, digest in sha256_tree(tiny).items()}
    for name, host in hosts.items():
        assert node_files(host, snapshot) == want, name


def test_worker_copy_without_blobs_fails_verification(hf_source, hosts, nodes, ansible):
    """The known pitfall, made on purpose on the worker: the module names the dangling links.
    The test puts the whole repository on the worker itself (a tar of hf_source, links kept),
    so it needs no earlier test's sync."""
    worker = nodes[1].name
    repo = f"{BASE}/whole/{hf_source.name}"
    broken = f"{BASE}/broken/{hf_source.name}"
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w") as tar:
        tar.add(hf_source, arcname=hf_source.name)
    on_node(nodes[1], "mkdir", "-p", f"{BASE}/whole")
    on_node(nodes[1], "tar", "-C", f"{BASE}/whole", "-x", data=packed.getvalue())
    hosts[worker].check_output(
        f"sudo mkdir -p {broken} && sudo cp -a {repo}/snapshots {repo}/refs {broken}/"
    )
    whole = ansible(
        worker, "dgx_spark.cluster.model_manifest", json.dumps({"path": repo}), "--become"
    )
    expected = whole[worker]["manifest"]
    res = ansible(
        worker,
        "dgx_spark.cluster.model_manifest",
        json.dumps({"path": broken, "expected": expected}),
    )
    assert res[worker].get("failed"), res[worker]
    assert "dangling symlinks, blobs not copied" in res[worker]["msg"]
    assert sorted(res[worker]["problems"]["dangling"]) == sorted(expected)


def test_snapshot_without_its_blobs_is_refused_as_a_source(hf_source, hosts, nodes):
    target = f"{BASE}/snapshot-only"
    snapshot = hf_source / "snapshots" / COMMIT
    report = run_playbook(
        "-e", f"model_cache_dir={target}", "-e", f"model_cache_local_dir={snapshot}"
    )
    assert report["rc"] != 0
    (message,) = failures(report)
    assert "model_cache_local_dir" in message and "models--Org--Name" in message
    assert changed(report) == {"localhost": 0, **{n.name: 0 for n in nodes}}
    for host in hosts.values():
        assert not host.file(target).exists


# --------------------------------------------------------------------------- Hub download
# The real Hub is out of reach, so a stand-in (fake_hub.py) runs on the head; the download
# container (the donor image, which ships huggingface_hub) reaches it on the host network.

HUB_PORT = 18765
HUB_REPO = "sim/tiny"
HUB_TOKEN = "hf_simTokenNeverLogged"
HUB_DIR = "/tmp/dgx-test-fake-hub"


@pytest.fixture(scope="module")
def fake_hub(hosts, nodes, tiny, ansible, tmp_path_factory):
    head = nodes[0].name
    host = hosts[head]
    bundle = tmp_path_factory.mktemp("fake-hub")
    shutil.copy(Path(__file__).with_name("fake_hub.py"), bundle)
    shutil.copytree(tiny, bundle / "files")
    host.run(f"rm -rf {HUB_DIR}")
    copied = ansible(head, "ansible.builtin.copy", f"src={bundle}/ dest={HUB_DIR}/")
    assert not copied[head].get("failed"), copied[head].get("msg")
    pid = host.check_output(
        f"cd {HUB_DIR} && (nohup python3 fake_hub.py files {HUB_PORT} {HUB_REPO} {COMMIT} "
        f"{HUB_TOKEN} > hub.log 2>&1 & echo $!)"
    )
    host.check_output(
        f"for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:{HUB_PORT}/ && exit 0; "
        "sleep 0.2; done; exit 1"
    )
    yield host
    host.run(f"kill {pid}; rm -rf {HUB_DIR}")


def hub_run(target: str, *extra: str) -> dict:
    return run_playbook(
        "-e", "model_cache_source=huggingface",
        "-e", f"model_cache_repo_id={HUB_REPO}",
        "-e", f"model_cache_hf_endpoint=http://127.0.0.1:{HUB_PORT}",
        "-e", "model_cache_download_image=vllm-donor:0.32.0-cpu",
        "-e", f"model_cache_dir={target}",
        *extra,
    )  # fmt: skip


def test_gated_repo_without_token_is_refused_before_any_change(fake_hub, hosts, nodes):
    target = f"{BASE}/hub-no-token"
    report = hub_run(target)
    assert report["rc"] != 0
    (message,) = failures(report)
    assert "model_cache_hf_token" in message and "ansible-vault encrypt_string" in message
    assert changed(report) == {"localhost": 0, **{n.name: 0 for n in nodes}}
    for host in hosts.values():
        assert not host.file(target).exists


def test_hub_download_lands_once_and_keeps_the_token_out_of_sight(fake_hub, hosts, nodes, tiny):
    target = f"{BASE}/hub"
    token = ("-e", f"model_cache_hf_token={HUB_TOKEN}")
    report = hub_run(target, *token)
    assert report["rc"] == 0, failures(report)
    # The JSON callback prints every result with its module arguments.
    assert HUB_TOKEN not in json.dumps(report)
    downloads = [line for line in fake_hub.check_output(f"cat {HUB_DIR}/hub.log").splitlines()
                 if "/resolve/" in line]  # fmt: skip
    assert downloads and all(line.startswith("authorized=True") for line in downloads)
    repo = f"{target}/hub/models--sim--tiny"
    assert fake_hub.check_output(f"cat {repo}/refs/main") == COMMIT
    assert not fake_hub.run(
        "sudo docker ps -aq --filter name=dgx-spark-model-download"
    ).stdout.strip()
    assert not fake_hub.file("/run/dgx-spark-model-cache/hf_token").exists
    want = {rel: (digest, f"../../blobs/{digest}") for rel, digest in sha256_tree(tiny).items()}
    for name, host in hosts.items():
        assert node_files(host, f"{repo}/snapshots/{COMMIT}") == want, name
    facts = results(report, FACTS_TASK)[nodes[-1].name]["ansible_facts"]
    assert facts["model_cache_model_path"] == f"{repo}/snapshots/{COMMIT}"
    assert facts["model_cache_env"] == {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_CACHE": f"{target}/hub",
    }

    again = hub_run(target, *token)
    assert again["rc"] == 0, failures(again)
    assert changed(again) == {"localhost": 0, **{n.name: 0 for n in nodes}}
    assert not results(again, "Start the download container"), (
        "a complete copy was downloaded again"
    )


def test_facts_entry_point_finds_the_model_read_only(first_run, nodes, tmp_path):
    """What a serving play runs alone (tasks_from: facts) to learn where the model is."""
    playbook = tmp_path / "facts.yml"
    playbook.write_text(
        "- name: Learn where the model is\n"
        "  hosts: sparks\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Read the model facts\n"
        "      ansible.builtin.include_role:\n"
        "        name: dgx_spark.cluster.model_cache\n"
        "        tasks_from: facts\n"
    )
    report = run_playbook("-e", f"model_cache_dir={BASE}/plain", playbook=str(playbook))
    assert report["rc"] == 0, failures(report)
    assert changed(report) == {n.name: 0 for n in nodes}
    for node in nodes:
        facts = results(report, FACTS_TASK)[node.name]["ansible_facts"]
        assert facts["model_cache_model_path"] == f"{BASE}/plain/tiny-qwen3-moe"
        assert facts["model_cache_volume"] == f"{BASE}/plain:{BASE}/plain:ro"
