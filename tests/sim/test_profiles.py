"""Model profiles on the running pair (inventories/sim/group_vars/all/model.yml): the sim's
two tiny profiles are of different architectures, and the second (a dense Qwen3) is one the
sim's base lacks and its donor has. Switching to it and back goes through the registry check,
the hybrid build and the group's restart for real, under a client whose downtime is measured;
a profile the images or the memory cannot serve is refused before anything changes.

The switch also takes the seed design's path: an older cluster base (Ray in a virtualenv, a
vLLM whose registry predates both architectures, no torch) with the donor's vLLM. So the
overlay of that layout is built once on the head, shipped to the worker, probed (registry,
NCCL, the image report) and served across both nodes; the transplant an owner might try
instead is refused with the alias left on the overlay.

The module starts from the pair converged with the inventory (conftest's converge) and ends
there: its last run switches back with the inventory's own profile, which the next module's
converge then finds (a no-op).
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import (
    CONVERGE,
    DEPLOYS_LOG,
    NOOP,
    converge,
    drills,
    node_image_id,
    on_node,
    run_playbook,
)
from test_operate import FEWER
from test_serving import KEY, Client, vllm_start_seconds
from test_upgrade import ALIAS, NCCL_STAMP, containers, short

SECOND = "sim-tiny-qwen3"
SECOND_MODEL = "tiny-qwen3"
MODELS = "/var/lib/dgx-spark/models"
RECORD = "/var/lib/dgx-spark/converged.json"
# The seed design's older base (sim/images/vllm-node-old): its vLLM imports neither profile.
OLD_BASE = "vllm-node:0.14.1-ray2.60.0"
DONOR = "vllm-donor:0.32.0-cpu"
# The second profile, with speculative decoding on (its n-gram method with two tokens), on the
# older base, built on the head and shipped to the worker (hybrid_image_mode build_once; the
# transplant below is refused on every node, as each_node, the default, builds it).
SWITCH = (
    "-e", f"spark_model_profile={SECOND}", "-e", "spark_model_speculative_tokens=2",
    "-e", f"hybrid_image_base={OLD_BASE}", "-e", "hybrid_image_mode=build_once",
)  # fmt: skip
LABEL = "dgx_spark.cluster.hybrid_image."
# A VLLM_PLUGINS that names no plugin the image has: vLLM's engine does not start under it.
BROKEN_PLUGINS = "dgxsim-test-no-such-plugin"
GENERATION_LABEL = '{{index .Config.Labels "dgx_spark.cluster.generation"}}'


def served(nodes) -> list[str]:
    models, error = drills.endpoint(f"http://{nodes[0].mgmt_ip}:8000", KEY, 30).models()
    assert not error, error
    return sorted(m["id"] for m in models)


def model_dirs(node) -> set[str]:
    return set(on_node(node, "ls", MODELS).stdout.split())


def state(nodes) -> dict:
    """What a refused run must leave as it was, on every node: the rank-holding containers
    (image, ID, start), the alias, the weights' directories and the converge record."""
    return {
        n.name: {
            "containers": containers(n),
            "alias": node_image_id(n, ALIAS),
            "models": model_dirs(n),
            "record": on_node(n, "stat", "-c", "%Y %s", RECORD).stdout.strip(),
        }
        for n in nodes
    }


def ask(nodes, model: str, n: int = 6) -> None:
    """Completions that repeat their prompt, so that the n-gram proposer finds drafts."""
    client = drills.endpoint(f"http://{nodes[0].mgmt_ip}:8000", KEY, 60)
    prompt = "spark node spark node spark node spark node"
    for _ in range(n):
        assert client.complete(model, prompt, max_tokens=16).ok


@pytest.fixture(scope="module")
def pair(request, sim, nodes):
    converge(request.module.__name__, nodes)
    return nodes


def impossible(name: str, **change) -> tuple[str, ...]:
    """-e for a profile of the inventory's first, changed as given (the inventory's own
    profiles are replaced: this one alone is known)."""
    import yaml
    from conftest import INVENTORY

    model = yaml.safe_load((INVENTORY / "group_vars/all/model.yml").read_text())
    profile = json.loads(json.dumps(model["spark_model_profiles"][model["spark_model_profile"]]))
    for section, values in change.items():
        profile[section] = {**profile[section], **values}
    profile["checkpoint"]["local_dir"] = "{{ inventory_dir }}/../../.sim/models/tiny-qwen3-moe"
    given = {"spark_model_profile": name, "spark_model_profiles": {name: profile}}
    return ("-e", json.dumps(given))


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"image": {"architectures": ["DgxsimNoSuchForCausalLM"]}},
            "needs DgxsimNoSuchForCausalLM, which neither the base vllm-node:0.32.0-ray2.60.0 "
            "nor the donor vllm-donor:0.32.0-cpu imports",
        ),
        ({"image": {"min_vllm": "99.0"}}, "has vLLM 0.32.0+cpu, older than 99.0"),
        ({"memory": {"kv_cache_gib": 100000}}, "(model_cache_kv_cache_gib, from the profile)"),
    ],
    ids=["architecture", "vllm", "memory"],
)
def test_a_profile_the_pair_cannot_serve_is_refused_before_anything_changes(pair, change, words):
    before = state(pair)
    run = run_playbook("deploy.yml", *impossible("sim-impossible", **change))
    assert run.rc != 0
    message = "\n".join(run.failures())
    assert words in message, message
    assert "profile sim-impossible" in message or "model_cache_kv_cache_gib" in message, message
    # Refused at preflight: no stage ran, nothing serving moved, no download, no record.
    assert state(pair) == before
    assert not [t for t in run.changed_tasks() if "Validate" not in t], run.changed_tasks()
    with DEPLOYS_LOG.open("a", encoding="utf-8") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} test_profiles: refused in "
                  f"{run.seconds:.1f}s: {words}\n")  # fmt: skip


def test_switching_profiles_moves_the_pair_and_back_under_a_client(pair):
    """Also what an owner's new image does to the running pair (the images stage alone moves
    the alias and nothing that serves; the no-op check and status see the ranks behind it; the
    next deploy.yml moves every rank in one restart), and the NCCL answer judged again on the
    image the ranks are to run."""
    nodes = pair
    models = (drills.SERVED_MODEL, SECOND_MODEL)
    before = {n.name: containers(n) for n in nodes}
    base_alias = {n.name: node_image_id(n, ALIAS) for n in nodes}
    assert served(nodes) == [drills.SERVED_MODEL]

    # 1. The images stage alone: its architecture is not in the base, so it builds the hybrid
    # (the donor's vLLM under the base's Ray) and points the alias at it; nothing that serves
    # notices. Nothing restarts here, so no gap is measured: a request every 6 s is enough to
    # see one fail, and leaves the build the CPU the answers would take.
    with Client(nodes, [KEY], models, period=6.0) as client:
        time.sleep(2)
        images = run_playbook("playbooks/images.yml", *SWITCH)
        time.sleep(2)
    assert images.rc == 0, images.failures() or images.raw[-3000:]
    assert client.failed == 0 and len(client.ok) >= images.seconds // 12, (client.failed, client.ok)
    assert f"serves profile {SECOND}" in images.messages() and "overlay" in images.messages()
    assert {n.name: containers(n) for n in nodes} == before
    alias = {n.name: node_image_id(n, ALIAS) for n in nodes}
    assert all(alias[n] != base_alias[n] for n in alias), (alias, base_alias)
    overlay_is_the_seed_designs(nodes, alias)

    # The transplant (the older base with the donor's model file alone): its registry lists
    # the architecture, its import fails, and the alias stays on the overlay.
    transplant = run_playbook(
        "playbooks/images.yml", *SWITCH, "-e", "hybrid_image_strategy=transplant",
        "-e", "hybrid_image_mode=each_node",
    )  # fmt: skip
    assert transplant.rc != 0
    said = "\n".join(transplant.failures())
    assert "lists Qwen3ForCausalLM in its registry, but the import fails" in said, said
    assert "No module named 'torch'" in said, said
    assert {n.name: node_image_id(n, ALIAS) for n in nodes} == alias
    listing = ("docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}",
               "--filter", "reference=dgx-spark/vllm-serving",
               "--filter", f"label={LABEL}strategy=transplant")  # fmt: skip
    for node in nodes:
        rejected = on_node(node, *listing).stdout.split()
        assert len(rejected) == 1 and rejected[0].endswith("-unverified"), (node.name, rejected)
        on_node(node, "docker", "image", "rm", rejected[0])

    # 2. What the rerun and status see: the ranks on the image before the alias.
    said = run_playbook("playbooks/noop.yml", *SWITCH).noop_report()
    assert said.startswith(CONVERGE), said
    assert f"spark_model_profile: sim-tiny-qwen3-moe -> {SECOND}" in said, said
    for node in nodes:
        for name in before[node.name]:
            assert (
                f"{node.name}: {ALIAS} is {short(alias[node.name])} but {name} runs "
                f"{short(before[node.name][name]['image'])}" in said
            ), said
    status = run_playbook("playbooks/status.yml", *SWITCH)
    assert status.rc != 0 and "the ranks are not on one image" in status.messages()

    # 3. deploy.yml: the second profile's weights go next to the first's, and every rank moves
    # to the hybrid in one restart of the group, serving the second model.
    with Client(nodes, [KEY], models) as client:
        time.sleep(2)
        run = run_playbook("deploy.yml", *SWITCH)
        time.sleep(3)
    assert run.rc == 0, run.failures() or run.raw[-3000:]
    assert run.noop_report().startswith(CONVERGE)
    assert served(nodes) == [SECOND_MODEL]
    for node in nodes:
        now = containers(node)
        assert set(now) == set(before[node.name]), now
        assert {c["image"] for c in now.values()} == {alias[node.name]}, (node.name, now)
        assert model_dirs(node) >= {"tiny-qwen3-moe", SECOND_MODEL}, node.name
    # The images stage finds the overlay images.yml made on both nodes: nothing built or shipped.
    built = (
        "Build the image under its unverified tag",
        "Stream the image from the head into this node",
    )
    assert not [t for t in run.changed_tasks() if "host_prep" in t or t.endswith(built)], (
        run.changed_tasks()
    )
    to_second, failed_to_second = client.longest_gap(), client.failed
    start_second = vllm_start_seconds(run)

    # 4. Speculative decoding's plumbing: the n-gram method reaches vLLM, and the benchmark
    # reports its acceptance from vLLM's counters; status and the results name the profile.
    ask(nodes, SECOND_MODEL)
    status = run_playbook("playbooks/status.yml", *SWITCH)
    assert status.rc == 0, status.failures()
    assert f"profile {SECOND}" in " ".join(status.messages().split()), status.messages()
    bench = run_playbook(
        "playbooks/benchmark.yml", *SWITCH,
        "-e", "operate_benchmark_results_dir=.cache/bench-profiles",
        "-e", '{"operate_benchmark_concurrency": [1]}', *FEWER,
    )  # fmt: skip
    assert bench.rc == 0, bench.failures() or bench.raw[-3000:]
    shown = bench.messages()
    assert f"profile: {SECOND}" in shown, shown
    assert "speculative decoding (ngram): " in shown and "draft tokens accepted" in shown, shown

    # 5. The kept weights go when asked, and the served ones are refused: while the second
    # profile serves, its weights stay and the first's go (the way back places them again).
    refused = run_playbook("playbooks/remove_weights.yml", *SWITCH)
    assert refused.rc != 0 and "holds the weights dgx-spark-vllm serves" in refused.messages()
    removed = run_playbook("playbooks/remove_weights.yml")
    assert removed.rc == 0, removed.failures()
    for node in nodes:
        assert "tiny-qwen3-moe" not in model_dirs(node) and SECOND_MODEL in model_dirs(node)

    # 6. Back to the inventory's profile: its weights are placed again, the images stage
    # points the alias at the base again (its own vLLM imports the first architecture), the
    # ray stage judges NCCL again on that image and keeps its answer, and every rank moves
    # back. The second profile's weights stay: the next run is a no-op.
    for node in nodes:
        on_node(node, "rm", "-f", NCCL_STAMP)
    with Client(nodes, [KEY], models) as client:
        time.sleep(2)
        back = run_playbook("deploy.yml")
        time.sleep(3)
    assert back.rc == 0, back.failures() or back.raw[-3000:]
    assert served(nodes) == [drills.SERVED_MODEL]
    for node in nodes:
        assert node_image_id(node, ALIAS) == base_alias[node.name], node.name
        assert {c["image"] for c in containers(node).values()} == {base_alias[node.name]}
        assert model_dirs(node) >= {"tiny-qwen3-moe", SECOND_MODEL}, node.name
        stamp = json.loads(on_node(node, "cat", NCCL_STAMP).stdout)
        assert stamp["inputs"]["image_id"] == base_alias[node.name] and stamp["result"], stamp
    start_back = vllm_start_seconds(back)
    again = run_playbook("deploy.yml")
    assert again.rc == 0 and again.noop_report().startswith(NOOP), again.noop_report()

    assert served(nodes) == [drills.SERVED_MODEL]
    figures = (
        f"profiles: images.yml {images.seconds:.0f}s (0 failed requests); to {SECOND} "
        f"{run.seconds:.0f}s (downtime {to_second:.0f}s, vLLM start {start_second:.0f}s, "
        f"{failed_to_second} failed requests); back {back.seconds:.0f}s "
        f"(downtime {client.longest_gap():.0f}s, vLLM start {start_back:.0f}s, "
        f"{client.failed} failed requests); no-op {again.seconds:.1f}s"
    )
    print(f"\n{figures}")
    with DEPLOYS_LOG.open("a", encoding="utf-8") as log:  # kept whether or not pytest shows it
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} test_profiles: {figures}\n")
    assert to_second <= start_second + 40 and client.longest_gap() <= start_back + 40


def overlay_is_the_seed_designs(nodes, alias: dict) -> None:
    """The alias on every node: the head's overlay of the older base and the donor, with the
    base's entrypoint, whose Python imports the base's Ray and the donor's vLLM."""
    head = nodes[0]
    form = "{{json .Config.Labels}}|{{json .Config.Entrypoint}}|{{json .RepoTags}}"
    labels, entrypoint, tags = (json.loads(part) for part in on_node(
        head, "docker", "image", "inspect", "--format", form, ALIAS).stdout.split("|"))  # fmt: skip
    base_entrypoint = on_node(head, "docker", "image", "inspect", "--format",
                              "{{json .Config.Entrypoint}}", OLD_BASE).stdout  # fmt: skip
    assert labels[f"{LABEL}strategy"] == "overlay", labels
    assert labels[f"{LABEL}base_id"] == node_image_id(head, OLD_BASE), labels
    assert labels[f"{LABEL}donor_id"] == node_image_id(head, DONOR), labels
    assert f"dgx-spark/vllm-serving:{labels[f'{LABEL}digest']}" in tags, tags
    assert entrypoint == json.loads(base_entrypoint), entrypoint
    assert len(set(alias.values())) == 1, alias  # built once, shipped

    def version(image: str, *names: str, entrypoint: bool = True) -> list[str]:
        """What the image's python3 says of the packages, through its entrypoint or not."""
        code = f"import importlib.metadata as m; print(*(m.version(n) for n in {names!r}))"
        argv = [image, "python3", "-c", code] if entrypoint else [
            "--entrypoint", "python3", image, "-c", code]  # fmt: skip
        run = on_node(head, "docker", "run", "--rm", "--network", "none", *argv)
        return run.stdout.splitlines()[-1].split()

    expected = version(OLD_BASE, "ray") + version(DONOR, "vllm", entrypoint=False)
    assert version(ALIAS, "ray", "vllm") == expected, expected


@pytest.mark.drill
def test_a_switch_whose_start_fails_rolls_back_to_the_previous_profile(pair):
    """The second profile with an environment under which its engine cannot start (it loads no
    platform plugin, so the CPU platform has no Ray device key; test_upgrade's drill bakes the
    same into an image): the group goes back to the previous containers, image, model and
    environment, whose weights a switch keeps."""
    nodes = pair
    before = {n.name: containers(n) for n in nodes}
    generation = on_node(nodes[0], "docker", "inspect", "-f", GENERATION_LABEL, "dgx-spark-vllm")
    failing = impossible(SECOND, env={"VLLM_PLUGINS": BROKEN_PLUGINS})
    given = json.loads(failing[1])
    profile = given["spark_model_profiles"][SECOND]
    profile["image"]["architectures"] = ["Qwen3ForCausalLM"]
    profile["serve"]["served_model_name"] = SECOND_MODEL
    profile["checkpoint"]["local_dir"] = "{{ inventory_dir }}/../../.sim/models/tiny-qwen3"
    with Client(nodes, [KEY], (drills.SERVED_MODEL, SECOND_MODEL)) as client:
        time.sleep(2)
        run = run_playbook("deploy.yml", "-e", json.dumps(given))
        time.sleep(3)
    assert run.rc != 0
    message = "\n".join(run.failures())
    assert "ValueError: current platform cpu does not support ray" in message, message
    assert "Rolled back: the previous containers serve again" in message, message
    assert served(nodes) == [drills.SERVED_MODEL]
    for node in nodes:
        now = containers(node)
        assert set(now) == set(before[node.name]), now
        assert {c["image"] for c in now.values()} == {
            c["image"] for c in before[node.name].values()
        }, node.name
    # The previous driver, made again beside the moved-back Ray containers: its configuration
    # (generation) and its environment, not the failed run's.
    env = on_node(nodes[0], "docker", "inspect", "-f", "{{json .Config.Env}}", "dgx-spark-vllm")
    assert BROKEN_PLUGINS not in env.stdout, env.stdout
    again = on_node(nodes[0], "docker", "inspect", "-f", GENERATION_LABEL, "dgx-spark-vllm")
    assert again.stdout == generation.stdout
    print(
        f"\nprofile rollback: deploy.yml {run.seconds:.0f}s, downtime "
        f"{client.longest_gap():.0f}s, {client.failed} failed requests"
    )
