"""deployment_record: what a node's record of its stages says against the node now."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml
from ansible_collections.dgx_spark.cluster.plugins.module_utils import deployment_record as dr
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils import deploy_stages

ROOT = Path(__file__).resolve().parents[4]
ALIAS = "dgx-spark/vllm-serving:current"
COMM = "/etc/dgx-spark/comm.env"
NETPLAN = "/etc/netplan/40-cx7.yaml"
OLD = "sha256:" + "7a5" * 21 + "7"
NEW = "sha256:" + "a63" * 21 + "a"


def inspected(name, cid="c1", running=True, started="2026-11-30T10:00:00Z", restarts=0,
              image=OLD, component="ray"):  # fmt: skip
    return {"Name": f"/{name}", "Id": cid, "Image": image, "RestartCount": restarts,
            "Config": {"Labels": {dr.COMPONENT_LABEL: component}},
            "State": {"Running": running, "StartedAt": started}}  # fmt: skip


CONTAINERS = dr.snapshot(
    [inspected("dgx-spark-ray"), inspected("dgx-spark-vllm", "c2", component="vllm")]
)
IMAGES = {"dgx-spark/vllm-serving:current": OLD, "vllm-donor:0.32.0-cpu": "sha256:" + "d" * 64}


STAGES = ("host_prep", "images", "model", "ray", "serve", "monitoring")
# Each stage's inputs: a digest per setting it reads, and the inventory's and collection's.
FINGERPRINT = {stage: {f"{stage}_x": stage[0] * 16, "common": "c" * 16} for stage in STAGES}
# What each stage leaves, in deploy.yml's order (roles/deploy_state/vars/main.yml).
LEFT_MAP = {
    "host_prep": {"files": [COMM, NETPLAN], "tables": ["inet dgx_spark"]},
    "images": {"images": list(IMAGES)},
    "model": {"trees": ["/var/lib/dgx-spark/models"]},
    "ray": {"components": ["ray", "ray-probe"]},
    "serve": {"components": ["vllm", "watchdog", "ray"]},
    "monitoring": {"components": ["prometheus", "node-exporter"]},
}


def node(**changes) -> dict:
    """The node as the stages left it, with changes."""
    now = {
        "fingerprint": FINGERPRINT,
        "containers": CONTAINERS,
        "images": IMAGES,
        "files": {"/etc/dgx-spark/comm.env": "c" * 64, "/etc/netplan/40-cx7.yaml": ""},
        "trees": {"/var/lib/dgx-spark/models": {"m/model-00001-of-00002.safetensors": [10, 5]}},
        "tables": {"inet dgx_spark": "t" * 64},
        "serving_image": {"ref": "dgx-spark/vllm-serving:current", "id": OLD},
    }
    return {**now, **changes}


def run_stages(now: dict, record: dict | None = None, stages=STAGES, left=None) -> dict:
    """The record after these stages ran, in order, each recording what it leaves of ``now``
    and what it is handed (``left``: the table, LEFT_MAP unless given)."""
    for stage in stages:
        leaves = (left or LEFT_MAP)[stage]
        given = {kind: now[kind] for kind in dr.ITEMS if kind in leaves}
        given.update(fingerprint=now["fingerprint"], containers=now["containers"])
        given.update(handed=dr.handed(leaves.get("handed"), now))
        record = dr.recorded(record, given, stage, leaves.get("components", []))
    return record


RECORD = run_stages(node())


def test_the_node_as_recorded_is_in_step():
    assert dr.compare(RECORD, node(), LEFT_MAP) == []
    assert sorted(RECORD) == ["format", "left", "stages"]
    assert list(RECORD["stages"]) == list(STAGES)
    assert RECORD["stages"]["serve"] == dr.stage_record(FINGERPRINT["serve"])
    assert "serving_image" not in RECORD["left"]
    assert dr.read_deployment_record(json.dumps(RECORD)) == RECORD


def test_no_record_is_out_of_step():
    assert dr.compare(None, node(), LEFT_MAP) == [dr.NO_RECORD]


LATER = "2026-11-30T11:00:00Z"
MOVED = "dgx-spark-vllm: restarted or changed since the last run"


@pytest.mark.parametrize(
    ("vllm", "extra", "reason"),
    [
        (None, [], "dgx-spark-vllm: gone"),
        ({"cid": "c3"}, [], "dgx-spark-vllm: recreated"),
        ({"cid": "c2", "running": False}, [], "dgx-spark-vllm: not running"),
        ({"cid": "c2", "started": LATER}, [], MOVED),
        ({"cid": "c2", "restarts": 1}, [], MOVED),
        ({"cid": "c2"}, [inspected("dgx-spark-watchdog", "c9", component="watchdog")],
         "dgx-spark-watchdog: not there at the last run"),
    ],
)  # fmt: skip
def test_a_container_that_moved_is_named(vllm, extra, reason):
    now = [inspected("dgx-spark-ray"), *extra]
    if vllm is not None:
        now.append(inspected("dgx-spark-vllm", component="vllm", **vllm))
    assert dr.compare(RECORD, node(containers=dr.snapshot(now)), LEFT_MAP) == [reason]


def test_changed_inputs_are_named_by_stage_and_setting():
    serve = {**FINGERPRINT["serve"], "vllm_serve_max_model_len": "1" * 16}
    assert dr.compare_stages(
        RECORD, node(fingerprint={**FINGERPRINT, "serve": serve}), LEFT_MAP
    ) == [("serve", "the serve stage's inputs changed: vllm_serve_max_model_len")]
    common = {stage: {**inputs, "common": "d" * 16} for stage, inputs in FINGERPRINT.items()}
    found = dr.compare_stages(RECORD, node(fingerprint=common), LEFT_MAP)
    assert found == [
        (stage, f"the {stage} stage's inputs changed: the inventory or the collection")
        for stage in STAGES
    ]
    many = {**FINGERPRINT["ray"], **{f"ray_cluster_{i}": "2" * 16 for i in range(5)}}
    assert dr.compare(RECORD, node(fingerprint={**FINGERPRINT, "ray": many}), LEFT_MAP) == [
        "the ray stage's inputs changed: ray_cluster_0, ray_cluster_1, ray_cluster_2 and 2 more"
    ]


def test_a_stage_without_a_record_is_named_and_an_older_shape_counts_as_none():
    """A run that failed in the ray stage recorded the stages before it only."""
    partial = run_stages(node(), stages=STAGES[:3])
    assert dr.compare_stages(partial, node(), LEFT_MAP) == [
        ("ray", "no record of the ray stage on this node"),
        ("serve", "no record of the serve stage on this node"),
        ("monitoring", "no record of the monitoring stage on this node"),
        ("ray", "dgx-spark-ray: not there at the last run"),
        ("serve", "dgx-spark-vllm: not there at the last run"),
    ]
    older = dr.stage_record({"host_prep": "h" * 64}, containers=CONTAINERS, images=IMAGES)
    assert dr.read_deployment_record(json.dumps(older)) is None
    assert dr.read_deployment_record("{}") is None
    assert dr.read_deployment_record(None) is None


def test_a_stage_run_alone_keeps_what_the_others_left():
    """The images stage run alone after comm.env was edited by hand: the edit is still named
    (only host_prep's record takes the file as it is now); host_prep alone takes it."""
    edited = node(files={**node()["files"], COMM: "e" * 64})
    after_images = run_stages(edited, RECORD, ["images"])
    assert dr.compare(after_images, edited, LEFT_MAP) == [f"{COMM}: edited since the last run"]
    assert dr.compare(run_stages(edited, after_images, ["host_prep"]), edited, LEFT_MAP) == []


def test_the_serve_stage_keeps_the_ray_containers_it_moved_and_a_stage_drops_its_gone_ones():
    moved = node(containers=dr.snapshot([
        inspected("dgx-spark-ray", "c5"),
        inspected("dgx-spark-vllm", "c6", component="vllm"),
        inspected("dgx-spark-prometheus", "c7", component="prometheus"),
    ]))  # fmt: skip
    assert dr.compare(run_stages(moved, RECORD, ["serve", "monitoring"]), moved, LEFT_MAP) == []
    gone = node(containers=CONTAINERS)
    record = run_stages(moved, RECORD, ["serve", "monitoring"])
    assert [stage for stage, _ in dr.compare_stages(record, gone, LEFT_MAP)] == [
        "monitoring",
        "ray",
        "serve",
    ]
    # The monitoring stage with spark_monitoring false removed its containers, and records so.
    assert (
        "dgx-spark-prometheus" not in run_stages(gone, record, ["monitoring"])["left"]["containers"]
    )


def test_the_alias_moved_away_from_what_the_ranks_run_is_named_per_container():
    """images.yml moved the alias: the containers still run the old image."""
    moved = node(images={**IMAGES, "dgx-spark/vllm-serving:current": NEW},
                 serving_image={"ref": "dgx-spark/vllm-serving:current", "id": NEW})  # fmt: skip
    assert dr.compare(RECORD, moved, LEFT_MAP) == [
        f"{ALIAS} is sha256:a63a63a63a63 but dgx-spark-ray runs sha256:7a57a57a57a5",
        f"{ALIAS} is sha256:a63a63a63a63 but dgx-spark-vllm runs sha256:7a57a57a57a5",
        f"{ALIAS} is sha256:a63a63a63a63 (was sha256:7a57a57a57a5 at the last run)",
    ]


def test_the_alias_check_holds_without_a_record_and_skips_stopped_and_other_containers():
    containers = dr.snapshot(
        [
            inspected("dgx-spark-ray", image=NEW),
            inspected("dgx-spark-vllm-previous", "c4", running=False, component="vllm"),
            inspected("dgx-spark-watchdog", "c5", component="watchdog"),
        ]
    )
    serving = {"ref": "dgx-spark/vllm-serving:current", "id": NEW}
    assert dr.compare(None, node(containers=containers, serving_image=serving), LEFT_MAP) == [
        dr.NO_RECORD
    ]
    half = dr.snapshot(
        [inspected("dgx-spark-ray", image=NEW), inspected("dgx-spark-vllm", "c2", component="vllm")]
    )
    assert dr.rank_image_reasons(serving["ref"], NEW, half) == [
        f"{ALIAS} is sha256:a63a63a63a63 but dgx-spark-vllm runs sha256:7a57a57a57a5"
    ]
    assert dr.rank_image_reasons("", NEW, half) == []


def test_a_donor_pulled_anew_is_named():
    pulled = node(images={**IMAGES, "vllm-donor:0.32.0-cpu": NEW})
    assert dr.compare(RECORD, pulled, LEFT_MAP) == [
        "vllm-donor:0.32.0-cpu is sha256:a63a63a63a63 (was sha256:dddddddddddd at the last run)"
    ]


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({COMM: "e" * 64}, f"{COMM}: edited since the last run"),
        ({COMM: ""}, f"{COMM}: gone since the last run"),
        ({NETPLAN: "n" * 64}, f"{NETPLAN}: not there at the last run"),
    ],
)  # fmt: skip
def test_a_host_file_that_moved_is_named(files, reason):
    assert dr.compare(RECORD, node(files={**node()["files"], **files}), LEFT_MAP) == [reason]


def test_a_weight_file_that_moved_is_named():
    root = "/var/lib/dgx-spark/models"
    edited = node(trees={root: {"m/model-00001-of-00002.safetensors": [10, 6], "m/extra": [1, 1]}})
    assert dr.compare(RECORD, edited, LEFT_MAP) == [
        f"{root}: m/extra, m/model-00001-of-00002.safetensors changed, appeared or went since the "
        "last run"
    ]
    many = node(trees={root: {f"f{i}": [1, 1] for i in range(5)}})
    assert "f0, f1, f2 and 3 more" in dr.compare(RECORD, many, LEFT_MAP)[0]


@pytest.mark.parametrize(
    ("digest", "word"), [("", "gone"), ("u" * 64, "differs")]
)  # fmt: skip
def test_a_live_table_that_moved_is_named(digest, word):
    assert dr.compare(RECORD, node(tables={"inet dgx_spark": digest}), LEFT_MAP) == [
        f"nftables table inet dgx_spark: {word} since the last run"
    ]


def test_file_digest_is_sha256_of_the_bytes_and_empty_when_absent(tmp_path):
    path = tmp_path / "comm.env"
    path.write_bytes(b"NCCL_IB_HCA=rocep1s0f1\n")
    # Known value: sha256 of that line, computed by hashlib directly.
    assert dr.file_digest(str(path)) == hashlib.sha256(b"NCCL_IB_HCA=rocep1s0f1\n").hexdigest()
    assert dr.file_digest(str(tmp_path / "missing")) == ""
    assert dr.text_digest("") == ""


def test_tree_stat_follows_links_and_leaves_hidden_entries_out(tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"x" * 7)
    snap = tmp_path / "snapshots" / "rev"
    snap.mkdir(parents=True)
    (snap / "model.safetensors").symlink_to(blobs / "abc")
    (snap / "gone.safetensors").symlink_to(blobs / "nothing")
    (tmp_path / ".verified").mkdir()
    (tmp_path / ".verified" / "x.json").write_text("{}")
    os.utime(blobs / "abc", ns=(1, 1_000_000_123))
    assert dr.tree_stat(str(tmp_path)) == {
        "blobs/abc": [7, 1_000_000_123],
        "snapshots/rev/gone.safetensors": [-1, -1],
        "snapshots/rev/model.safetensors": [7, 1_000_000_123],
    }


def test_tree_fingerprint_walks_into_directory_links_only_when_asked(tmp_path):
    """model_manifest walks a linked directory (and names links that leave the tree); the
    records and the args check record the link and stay within the tree."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "w.safetensors").write_bytes(b"w" * 3)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "shards").symlink_to(outside)
    (tree / "shards-again").symlink_to(outside)
    (tree / "loop").symlink_to(".")
    plain = dr.tree_fingerprint(str(tree))
    assert [entry[0] for entry in plain["entries"]] == ["loop", "shards", "shards-again"]
    assert plain["entries"][1][3] == str(outside)
    walked = dr.tree_fingerprint(str(tree), into_links=True)
    assert walked["complete"]
    mtime = (outside / "w.safetensors").stat().st_mtime_ns
    # The outside directory once, by its first name; the loop not again.
    assert walked["entries"] == [["shards/w.safetensors", 3, mtime, None]]


STAGED = RECORD


def more(*inspections) -> dict:
    """The recorded containers and these."""
    return {**CONTAINERS, **dr.snapshot(list(inspections))}


@pytest.mark.parametrize(
    ("changes", "stages"),
    [
        ({}, []),
        # The stages whose inputs changed.
        ({"fingerprint": {**FINGERPRINT, "serve": {"common": "x" * 16}}}, ["serve"]),
        ({"fingerprint": {**FINGERPRINT, "images": {}}}, ["images"]),
        ({"fingerprint": {**FINGERPRINT, "host_prep": {"x": "1"}, "ray": {"x": "1"}}},
         ["host_prep", "ray"]),
        # A stage no run recorded yet.
        ({"fingerprint": {**FINGERPRINT, "later": {}}}, ["later"]),
        # A container: the stage that starts it; one no stage is known to start, every stage.
        ({"containers": dr.snapshot([inspected("dgx-spark-ray")])}, ["serve"]),
        ({"containers": dr.snapshot([inspected("dgx-spark-vllm", "c2", component="vllm")])},
         ["ray"]),
        ({"containers": more(inspected("w", "c9", component="watchdog"))}, ["serve"]),
        ({"containers": more(inspected("p", "c8", component="prometheus"))}, ["monitoring"]),
        ({"containers": more(inspected("x", "c7", component=""))}, ["host_prep"]),
        ({"images": {**IMAGES, "vllm-donor:0.32.0-cpu": NEW}}, ["images"]),
        ({"files": {**node()["files"], COMM: "e" * 64}}, ["host_prep"]),
        ({"trees": {"/var/lib/dgx-spark/models": {}}}, ["model"]),
        ({"tables": {"inet dgx_spark": ""}}, ["host_prep"]),
    ],
)  # fmt: skip
def test_each_difference_names_the_first_stage_it_concerns(changes, stages):
    found = dr.compare_stages(STAGED, node(**changes), LEFT_MAP)
    assert [stage for stage, _reason in found] == stages
    assert dr.stages_concerned(found) == list(dict.fromkeys(stages))


def test_a_rebuilt_image_starts_at_the_images_stage_whatever_the_ranks_run():
    """images.yml moved the alias and the donor: the images stage (the ranks move later)."""
    moved = node(
        images={**IMAGES, ALIAS: NEW, "vllm-donor:0.32.0-cpu": NEW},
        serving_image={"ref": ALIAS, "id": NEW},
    )
    found = dr.compare_stages(STAGED, moved, LEFT_MAP)
    assert [stage for stage, _reason in found] == ["ray", "ray", "images", "images"]
    assert dr.stages_concerned(found) == ["ray", "images"]
    assert dr.compare_stages(None, moved, LEFT_MAP)[0] == ("host_prep", dr.NO_RECORD)
    assert dr.stages_concerned(dr.compare_stages(None, moved, LEFT_MAP)) == ["host_prep", "ray"]


def test_the_role_s_table_of_what_each_stage_leaves_is_in_deploy_yml_s_order():
    """The first stage in it is where a node without a record starts; each difference is the
    first stage's that leaves it."""
    left = yaml.safe_load((ROOT / "roles/deploy_state/vars/main.yml").read_text())
    assert tuple(left["_deploy_state_left"]) == deploy_stages.load().order
    assert list(LEFT_MAP) == list(left["_deploy_state_left"])
    assert dr.owners(LEFT_MAP)[("components", "ray")] == "ray"
    assert dr.compare_stages(None, node(), {})[0] == ("", dr.NO_RECORD)


MODELS = "/var/lib/dgx-spark/models"
# The role's table with what the ray and serve stages are handed (roles/deploy_state/vars).
HANDED_MAP = {
    **LEFT_MAP,
    "ray": {**LEFT_MAP["ray"], "handed": {"files": [COMM]}},
    "serve": {**LEFT_MAP["serve"],
              "handed": {"files": [COMM], "trees": [MODELS], "components": ["ray"]}},
}  # fmt: skip


def test_a_later_stage_is_named_for_what_an_earlier_one_changed_of_what_it_is_handed():
    """A run that started at host_prep asks again at each later stage's turn: after host_prep
    rewrote comm.env and recorded, the ray and serve stages (which load it) differ; after the
    ray stage recreated its containers, the serve stage (whose ranks run in them) differs; a
    changed firewall table moves no later stage. The record keeps a digest of each item."""
    record = run_stages(node(), left=HANDED_MAP)
    assert dr.compare(record, node(), HANDED_MAP) == []
    assert sorted(record["stages"]["serve"]["handed"]) == [
        "components ray",
        f"files {COMM}",
        f"trees {MODELS}",
    ]
    assert "handed" not in record["stages"]["host_prep"]
    edited = node(files={**node()["files"], COMM: "e" * 64})
    # Before host_prep runs again, the file is host_prep's difference alone.
    assert dr.compare_stages(record, edited, HANDED_MAP) == [
        ("host_prep", f"{COMM}: edited since the last run")
    ]
    after_host_prep = run_stages(edited, record, ["host_prep"], HANDED_MAP)
    assert dr.compare_stages(after_host_prep, edited, HANDED_MAP) == [
        ("ray", f"{COMM}: changed since the ray stage last ran"),
        ("serve", f"{COMM}: changed since the serve stage last ran"),
    ]
    moved = dr.snapshot([inspected("dgx-spark-ray", "c5"),
                         inspected("dgx-spark-vllm", "c2", component="vllm")])  # fmt: skip
    recreated = {**edited, "containers": moved}
    after_ray = run_stages(recreated, after_host_prep, ["ray"], HANDED_MAP)
    assert dr.compare_stages(after_ray, recreated, HANDED_MAP) == [
        ("serve", f"{COMM}: changed since the serve stage last ran"),
        ("serve", "the ray containers: changed since the serve stage last ran"),
    ]
    assert dr.compare(run_stages(recreated, after_ray, ["serve"], HANDED_MAP), recreated,
                      HANDED_MAP) == []  # fmt: skip
    # A firewall table host_prep loaded anew: no later stage is handed it.
    flushed = node(tables={"inet dgx_spark": "u" * 64})
    again = run_stages(flushed, record, ["host_prep"], HANDED_MAP)
    assert dr.compare(again, flushed, HANDED_MAP) == []


def test_a_stage_record_without_what_it_was_handed_is_named_once():
    """A record an older collection wrote (no handed): the stages handed anything run once."""
    older = run_stages(node())
    assert [stage for stage, _ in dr.compare_stages(older, node(), HANDED_MAP)] == [
        "ray",
        "serve",
        "serve",
        "serve",
    ]
    assert dr.compare(run_stages(node(), older, ["ray", "serve"], HANDED_MAP), node(),
                      HANDED_MAP) == []  # fmt: skip


def test_the_role_s_table_hands_a_stage_only_what_an_earlier_stage_leaves():
    left = yaml.safe_load((ROOT / "roles/deploy_state/vars/main.yml").read_text())
    table = left["_deploy_state_left"]
    order = list(table)
    owner = dr.owners(table)
    handed = {stage: kinds["handed"] for stage, kinds in table.items() if "handed" in kinds}
    assert sorted(handed) == ["ray", "serve"]
    for stage, kinds in handed.items():
        assert set(kinds) <= set(dr.KINDS), stage
        for kind, items in kinds.items():
            for item in items:
                assert order.index(owner[(kind, item)]) <= order.index(stage), (stage, item)


def test_an_image_the_settings_no_longer_name_is_no_difference():
    """molecule's images scenario gave the images stage another base once: the record keeps that
    image, but the inventory's deploys name another one; only the images named now count."""
    old_base, base = "vllm-node:0.14.1-ray2.60.0", "vllm-node:0.32.0-ray2.60.0"
    before = {old_base: "sha256:" + "b9" * 32, base: "sha256:" + "48" * 32}
    assert dr._image_reasons(before, {base: "sha256:" + "48" * 32}) == []
    moved = dr._image_reasons(before, {base: "sha256:" + "08" * 32})
    assert moved == [
        (base, f"{base} is sha256:080808080808 (was sha256:484848484848 at the last run)")
    ]
