"""module_utils/converge_record: the converge record against the node now, and the digests
and walker every record uses."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import converge_record as dr

ALIAS = "dgx-spark/vllm-serving:current"
COMM = "/etc/dgx-spark/comm.env"
NETPLAN = "/etc/netplan/40-cx7.yaml"
MODELS = "/var/lib/dgx-spark/models"
OLD = "sha256:" + "7a5" * 21 + "7"
NEW = "sha256:" + "a63" * 21 + "a"
AT = "2026-12-06T10:00:00Z"


def inspected(name, cid="c1", running=True, started="2026-11-30T10:00:00Z", restarts=0,
              image=OLD, component="ray"):  # fmt: skip
    return {"Name": f"/{name}", "Id": cid, "Image": image, "RestartCount": restarts,
            "Config": {"Labels": {dr.COMPONENT_LABEL: component}},
            "State": {"Running": running, "StartedAt": started}}  # fmt: skip


CONTAINERS = dr.snapshot(
    [inspected("dgx-spark-ray"), inspected("dgx-spark-vllm", "c2", component="vllm")]
)
IMAGES = {ALIAS: OLD, "vllm-donor:0.32.0-cpu": "sha256:" + "d" * 64}
SETTINGS = {"vllm_serve_max_model_len": 512, "spark_monitoring": False, "vllm_serve_api_key": "s3"}
COMMON = {"nodes": ["172.30.240.11", "172.30.240.12"], "collection": "c" * 64}


def node(settings=None, common=None, **changes) -> dict:
    """The node as the last converge left it, with changes."""
    now = {
        "inputs": dr.recorded_inputs(settings or SETTINGS, common or COMMON),
        "containers": CONTAINERS,
        "images": IMAGES,
        "files": {COMM: "c" * 64, NETPLAN: ""},
        "trees": {MODELS: {"m/model-00001-of-00002.safetensors": [10, 5]}},
        "tables": {"inet dgx_spark": "t" * 64},
        "serving_image": {"ref": ALIAS, "id": OLD},
    }
    return {**now, **changes}


RECORD = dr.converge_record(node(), AT)


def test_the_node_as_the_last_converge_left_it_is_a_no_op():
    assert dr.compare(RECORD, node()) == []
    assert sorted(RECORD) == ["at", "format", "inputs", "left"]
    assert RECORD["at"] == AT
    assert "serving_image" not in RECORD["left"]
    assert dr.read_converge_record(json.dumps(RECORD)) == RECORD


def test_a_count_of_tokens_is_not_a_secret():
    """Only a name that ends as a secret's does (vllm_serve_api_key, model_cache_hf_token):
    spark_model_speculative_tokens and vllm_serve_max_num_batched_tokens keep their values."""
    kept = dr.recorded_inputs(
        {"spark_model_speculative_tokens": 2, "vllm_serve_max_num_batched_tokens": 8192,
         "model_cache_hf_token": "hf_x", "ray_cluster_auth_token": "t"},
        {},
    )["settings"]  # fmt: skip
    assert kept["spark_model_speculative_tokens"] == 2
    assert kept["vllm_serve_max_num_batched_tokens"] == 8192
    assert kept["model_cache_hf_token"].startswith("sha256:")
    assert kept["ray_cluster_auth_token"].startswith("sha256:")


def test_the_record_keeps_the_values_and_only_a_digest_of_a_secret():
    settings = RECORD["inputs"]["settings"]
    assert settings["vllm_serve_max_model_len"] == 512
    assert settings["vllm_serve_api_key"] == "sha256:" + dr.digest("s3", 12)
    assert "s3" not in json.dumps(RECORD)


def test_no_record_and_an_older_shape_converge():
    assert dr.compare(None, node()) == [dr.NO_RECORD]
    older = {"format": 1, "stages": {}, "left": {}}
    assert dr.read_converge_record(json.dumps(older)) is None
    assert dr.read_converge_record("not json") is None
    assert dr.read_converge_record(None) is None


def test_a_changed_setting_is_named_with_its_old_and_new_value():
    changed = {**SETTINGS, "vllm_serve_max_model_len": 256}
    assert dr.compare(RECORD, node(settings=changed)) == ["vllm_serve_max_model_len: 512 -> 256"]
    added = {**SETTINGS, "spark_extra_hosts": ["a"]}
    assert dr.compare(RECORD, node(settings=added)) == [
        'spark_extra_hosts: set to ["a"] (not set at the last converge)'
    ]
    removed = {k: v for k, v in SETTINGS.items() if k != "spark_monitoring"}
    assert dr.compare(RECORD, node(settings=removed)) == [
        "spark_monitoring: no longer set (was false)"
    ]
    key = {**SETTINGS, "vllm_serve_api_key": "other"}
    (line,) = dr.compare(RECORD, node(settings=key))
    assert line.startswith("vllm_serve_api_key: sha256:") and "other" not in line
    long = {**SETTINGS, "vllm_serve_max_model_len": "x" * 200}
    (line,) = dr.compare(RECORD, node(settings=long))
    assert line.endswith("…") and len(line) < 150


def test_a_changed_collection_or_inventory_is_named():
    assert dr.compare(RECORD, node(common={**COMMON, "collection": "e" * 64})) == [
        "the collection's files changed since the last converge"
    ]
    assert dr.compare(RECORD, node(common={**COMMON, "nodes": ["172.30.240.11"]})) == [
        "the inventory's nodes changed since the last converge"
    ]


LATER = "2026-11-30T11:00:00Z"
MOVED = "dgx-spark-vllm: restarted or changed since the last converge"


@pytest.mark.parametrize(
    ("vllm", "extra", "reason"),
    [
        (None, [], "dgx-spark-vllm: gone"),
        ({"cid": "c3"}, [], "dgx-spark-vllm: recreated"),
        ({"cid": "c2", "running": False}, [], "dgx-spark-vllm: not running"),
        ({"cid": "c2", "started": LATER}, [], MOVED),
        ({"cid": "c2", "restarts": 1}, [], MOVED),
        ({"cid": "c2"}, [inspected("dgx-spark-watchdog", "c9", component="watchdog")],
         "dgx-spark-watchdog: not there at the last converge"),
    ],
)  # fmt: skip
def test_a_container_that_moved_is_named(vllm, extra, reason):
    now = [inspected("dgx-spark-ray"), *extra]
    if vllm is not None:
        now.append(inspected("dgx-spark-vllm", component="vllm", **vllm))
    assert dr.compare(RECORD, node(containers=dr.snapshot(now))) == [reason]


def test_the_alias_moved_away_from_what_the_ranks_run_is_named_per_container():
    """images.yml run alone moved the alias: the containers still run the old image."""
    moved = node(images={**IMAGES, ALIAS: NEW}, serving_image={"ref": ALIAS, "id": NEW})
    assert dr.compare(RECORD, moved) == [
        f"{ALIAS} is sha256:a63a63a63a63 but dgx-spark-ray runs sha256:7a57a57a57a5",
        f"{ALIAS} is sha256:a63a63a63a63 but dgx-spark-vllm runs sha256:7a57a57a57a5",
        f"{ALIAS} is sha256:a63a63a63a63 (was sha256:7a57a57a57a5 at the last converge)",
    ]


def test_the_alias_check_holds_without_a_record_and_skips_stopped_and_other_containers():
    containers = dr.snapshot(
        [
            inspected("dgx-spark-ray", image=NEW),
            inspected("dgx-spark-vllm-previous", "c4", running=False, component="vllm"),
            inspected("dgx-spark-watchdog", "c5", component="watchdog"),
        ]
    )
    serving = {"ref": ALIAS, "id": NEW}
    assert dr.compare(None, node(containers=containers, serving_image=serving)) == [dr.NO_RECORD]
    half = dr.snapshot(
        [inspected("dgx-spark-ray", image=NEW), inspected("dgx-spark-vllm", "c2", component="vllm")]
    )
    assert dr.rank_image_reasons(ALIAS, NEW, half) == [
        f"{ALIAS} is sha256:a63a63a63a63 but dgx-spark-vllm runs sha256:7a57a57a57a5"
    ]
    assert dr.rank_image_reasons("", NEW, half) == []


def test_a_donor_pulled_anew_is_named_and_an_image_no_longer_named_is_not():
    pulled = node(images={**IMAGES, "vllm-donor:0.32.0-cpu": NEW})
    assert dr.compare(RECORD, pulled) == [
        "vllm-donor:0.32.0-cpu is sha256:a63a63a63a63 (was sha256:dddddddddddd at the last "
        "converge)"
    ]
    # Another base named once (test_profiles' switch): only the images named now count.
    assert dr.compare(RECORD, node(images={ALIAS: OLD})) == []


@pytest.mark.parametrize(
    ("files", "reason"),
    [
        ({COMM: "e" * 64}, f"{COMM}: edited since the last converge"),
        ({COMM: ""}, f"{COMM}: gone since the last converge"),
        ({NETPLAN: "n" * 64}, f"{NETPLAN}: not there at the last converge"),
    ],
)  # fmt: skip
def test_a_host_file_that_moved_is_named(files, reason):
    assert dr.compare(RECORD, node(files={**node()["files"], **files})) == [reason]


def test_a_weight_file_that_moved_is_named():
    edited = node(
        trees={MODELS: {"m/model-00001-of-00002.safetensors": [10, 6], "m/extra": [1, 1]}}
    )
    assert dr.compare(RECORD, edited) == [
        f"{MODELS}: m/extra, m/model-00001-of-00002.safetensors changed, appeared or went since "
        "the last converge"
    ]
    many = node(trees={MODELS: {f"f{i}": [1, 1] for i in range(5)}})
    assert "f0, f1, f2 and 3 more" in dr.compare(RECORD, many)[0]


@pytest.mark.parametrize(("digest", "word"), [("", "gone"), ("u" * 64, "differs")])
def test_a_live_table_that_moved_is_named(digest, word):
    assert dr.compare(RECORD, node(tables={"inet dgx_spark": digest})) == [
        f"nftables table inet dgx_spark: {word} since the last converge"
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


def test_fingerprint_lists_every_file_with_size_and_time(tmp_path):
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / ".hidden").write_text("x")
    (tmp_path / "sub" / "deeper" / "w.bin").write_bytes(b"12345")
    os.utime(tmp_path / "config.json", ns=(1, 1_000_000_007))
    got = dr.tree_fingerprint(str(tmp_path))
    assert got["exists"] and got["complete"]
    by_path = {e[0]: e for e in got["entries"]}
    assert sorted(by_path) == [".hidden", "config.json", os.path.join("sub", "deeper", "w.bin")]
    assert by_path["config.json"] == ["config.json", 2, 1_000_000_007, None]
    assert by_path[os.path.join("sub", "deeper", "w.bin")][1] == 5
    # Directories are walked, not listed; the order is the paths'.
    assert [e[0] for e in got["entries"]] == sorted(by_path)


def test_fingerprint_sees_a_file_rewritten_in_place(tmp_path):
    (tmp_path / "config.json").write_text('{"a": 1}')
    os.utime(tmp_path / "config.json", ns=(1, 10))
    before = dr.tree_fingerprint(str(tmp_path))
    (tmp_path / "config.json").write_text('{"a": 2}')
    os.utime(tmp_path / "config.json", ns=(1, 20))
    after = dr.tree_fingerprint(str(tmp_path))
    assert before != after


def test_fingerprint_stats_linked_files_but_does_not_walk_linked_directories(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.bin").write_bytes(b"x" * 10)
    blob = tmp_path / "blob"
    blob.write_bytes(b"y" * 42)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "weights.safetensors").symlink_to(blob)
    (tree / "elsewhere").symlink_to(outside, target_is_directory=True)
    (tree / "dangling").symlink_to(tmp_path / "nothing")
    got = dr.tree_fingerprint(str(tree))
    by_path = {e[0]: e for e in got["entries"]}
    assert by_path["weights.safetensors"][1:] == [42, blob.stat().st_mtime_ns, str(blob)]
    assert by_path["dangling"][1:] == [-1, -1, str(tmp_path / "nothing")]
    # The linked directory is one entry, its target's; nothing below it is listed.
    assert by_path["elsewhere"][3] == str(outside)
    assert not any("secret" in path for path in by_path)


def test_fingerprint_of_a_missing_path(tmp_path):
    got = dr.tree_fingerprint(str(tmp_path / "none"))
    assert got == {"exists": False, "complete": True, "entries": []}


def test_fingerprint_of_a_file(tmp_path):
    path = tmp_path / "template.jinja"
    path.write_text("{{ x }}")
    got = dr.tree_fingerprint(str(path))
    assert got["entries"] == [[".", 7, path.stat().st_mtime_ns, None]]


def test_fingerprint_of_a_large_tree_is_incomplete(tmp_path):
    for index in range(6):
        (tmp_path / f"f{index}").write_text("x")
    assert dr.tree_fingerprint(str(tmp_path), limit=6)["complete"] is True
    too_many = dr.tree_fingerprint(str(tmp_path), limit=5)
    assert too_many["complete"] is False


def test_directories_count_towards_the_limit(tmp_path):
    for index in range(3):
        (tmp_path / f"d{index}").mkdir()
    (tmp_path / "d0" / "f").write_text("x")
    assert dr.tree_fingerprint(str(tmp_path), limit=4)["complete"] is True
    assert dr.tree_fingerprint(str(tmp_path), limit=3)["complete"] is False


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any directory")
def test_fingerprint_of_an_unreadable_directory_is_incomplete(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "f").write_text("x")
    locked.chmod(0)
    try:
        assert dr.tree_fingerprint(str(tmp_path))["complete"] is False
    finally:
        locked.chmod(stat.S_IRWXU)
