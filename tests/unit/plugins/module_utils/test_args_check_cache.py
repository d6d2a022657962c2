"""Tests for plugins/module_utils/args_check_cache.py: the fingerprint of the mounted files,
the key of an answer, and the entries of the cache directory."""

from __future__ import annotations

import json
import os
import stat

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import args_check_cache as acc
from ansible_collections.dgx_spark.cluster.plugins.module_utils import deployment_record as dr
from ansible_collections.dgx_spark.cluster.plugins.module_utils.vllm_args_probe import (
    args_probe_entrypoint,
    args_probe_request,
)

IMAGE_ID = "sha256:" + "ab" * 32
MODEL = "/var/lib/dgx-spark/models/tiny"
ARGS = [MODEL, "--tensor-parallel-size", "2", "--reasoning-parser", "qwen3"]
VOLUMES = [f"{MODEL}:{MODEL}:ro"]
TREE = {
    "exists": True,
    "complete": True,
    "entries": [["config.json", 700, 1_700_000_000_000_000_000, None],
                ["model.safetensors", 9000, 1_700_000_000_000_000_001, None]],
}  # fmt: skip
DOCUMENT = {"vllm": "0.32.0", "errors": {}, "registries": {}, "timings": {}, "seconds": 6.4}


def key(**changes) -> str | None:
    given = {
        "image_id": IMAGE_ID,
        "args": ARGS,
        "environment": {"HF_HUB_OFFLINE": "1", "VLLM_USE_V1": "1"},
        "model_config": True,
        "volumes": VOLUMES,
        "python": None,
        "probe": acc.probe_digest(args_probe_entrypoint("python"), args_probe_request(ARGS, True)),
        "trees": {MODEL: TREE},
    }
    given.update(changes)
    return acc.cache_key(**given)


def with_entries(*entries) -> dict:
    return {**TREE, "entries": [list(e) for e in entries]}


# --------------------------------------------------------------------------- the key


def test_the_key_is_stable_and_a_sha256():
    assert key() == key()
    assert len(key()) == 64 and int(key(), 16) >= 0


def test_the_key_does_not_depend_on_the_order_of_the_environment():
    env = {"HF_HUB_OFFLINE": "1", "VLLM_USE_V1": "1"}
    assert key(environment=dict(reversed(list(env.items())))) == key(environment=env)


def test_the_same_inputs_built_anew_give_the_same_key():
    tree = json.loads(json.dumps(TREE))
    assert key(args=list(ARGS), trees={MODEL: tree}, volumes=list(VOLUMES)) == key()


@pytest.mark.parametrize(
    "changes",
    [
        {"image_id": "sha256:" + "cd" * 32},
        {"args": [*ARGS[:2], "4", *ARGS[3:]]},
        {"args": [*ARGS, "--enforce-eager"]},
        {"environment": {"HF_HUB_OFFLINE": "0", "VLLM_USE_V1": "1"}},
        {"environment": {"HF_HUB_OFFLINE": "1"}},
        {"model_config": False},
        {"python": "/opt/vllm/bin/python3"},
        {"volumes": [f"{MODEL}:/models/tiny:ro"], "trees": {MODEL: TREE}},
        {"probe": acc.probe_digest(["python", "-c", "print(1)"], args_probe_request(ARGS, True))},
        {"trees": {MODEL: with_entries(["config.json", 701, 1_700_000_000_000_000_000, None],
                                       TREE["entries"][1])}},
        {"trees": {MODEL: with_entries(["config.json", 700, 1_700_000_000_000_000_009, None],
                                       TREE["entries"][1])}},
        {"trees": {MODEL: with_entries(*TREE["entries"], ["tokenizer.json", 1, 1, None])}},
        {"trees": {MODEL: with_entries(TREE["entries"][0])}},
        {"trees": {MODEL: with_entries(["config.json", 700, 1_700_000_000_000_000_000, "../b/1"],
                                       TREE["entries"][1])}},
        {"trees": {MODEL: {"exists": False, "complete": True, "entries": []}}},
    ],
    ids=["image", "one-arg", "more-args", "env-value", "env-gone", "model-config", "python",
         "volume", "probe", "size", "mtime", "new-file", "file-gone", "link", "missing"],
)  # fmt: skip
def test_each_input_changes_the_key(changes):
    changed = key(**changes)
    assert changed is not None and changed != key()


def test_the_probe_digest_covers_its_source_and_its_request():
    base = acc.probe_digest(args_probe_entrypoint("python"), args_probe_request(ARGS, True))
    assert base != acc.probe_digest(args_probe_entrypoint("python"), args_probe_request(ARGS))
    other_source = [*args_probe_entrypoint("python")[:2], "print('other probe')"]
    assert base != acc.probe_digest(other_source, args_probe_request(ARGS, True))


@pytest.mark.parametrize(
    "changes",
    [
        {"image_id": None},
        {"image_id": ""},
        {"trees": {}},
        {"trees": {MODEL: {"exists": True, "complete": False, "entries": []}}},
        {"volumes": ["models:/models:ro"], "trees": {"models": TREE}},
    ],
    ids=["no-image-id", "empty-image-id", "no-fingerprint", "incomplete", "named-volume"],
)
def test_what_cannot_be_fingerprinted_has_no_key(changes):
    assert key(**changes) is None


def test_no_volumes_needs_no_fingerprint():
    assert key(volumes=[], trees={}) is not None


# --------------------------------------------------------------------------- the walk


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
    assert key(trees={MODEL: before}) != key(trees={MODEL: after})


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
    assert key(trees={MODEL: got}) is not None


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
    assert key(trees={MODEL: too_many}) is None


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


# --------------------------------------------------------------------------- the entries


def test_write_then_read(tmp_path):
    cache = tmp_path / "state" / "args-accepted"
    path = acc.write_entry(str(cache), key(), IMAGE_ID, DOCUMENT)
    assert path == str(cache / f"{key()}.json")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert os.listdir(cache) == [f"{key()}.json"]  # no temporary file left
    entry = acc.read_entry(str(cache), key())
    assert entry == {
        "format": 1, "inputs": {"key": key()}, "digest": dr.digest({"key": key()}, 16),
        "image_id": IMAGE_ID, "document": DOCUMENT,
    }  # fmt: skip


def test_an_existing_directory_keeps_its_mode(tmp_path):
    tmp_path.chmod(0o755)
    acc.write_entry(str(tmp_path), key(), IMAGE_ID, DOCUMENT)
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o755


def entry_text(**changes) -> str:
    made = dr.stage_record({"key": key()}, image_id=IMAGE_ID, document=DOCUMENT)
    return json.dumps({**made, **changes})


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "",
        "[]",
        entry_text(inputs={"key": "0" * 64}),
        entry_text(format=99),
        entry_text(image_id=None),
        entry_text(document="accepted"),
        entry_text(document={}),
    ],
    ids=["broken", "empty", "list", "other-key", "other-version", "no-image-id", "no-document",
         "not-a-probe"],
)  # fmt: skip
def test_an_entry_that_is_not_one_is_ignored(tmp_path, text):
    (tmp_path / f"{key()}.json").write_text(text)
    assert acc.read_entry(str(tmp_path), key()) is None
    (tmp_path / f"{key()}.json").write_text(entry_text())
    assert acc.read_entry(str(tmp_path), key())["document"] == DOCUMENT


def test_no_entry(tmp_path):
    assert acc.read_entry(str(tmp_path / "none"), key()) is None


def test_prune_keeps_the_most_recent(tmp_path):
    names = [f"{index:064x}.json" for index in range(40)]
    for age, name in enumerate(names):
        (tmp_path / name).write_text("{}")
        os.utime(tmp_path / name, ns=(1, 1_000_000_000 * (age + 1)))
    (tmp_path / "notes.txt").write_text("not an entry")
    deleted = acc.prune(str(tmp_path))
    assert sorted(deleted) == names[:8]
    assert sorted(os.listdir(tmp_path)) == sorted([*names[8:], "notes.txt"])


def test_a_touched_entry_outlives_newer_ones(tmp_path):
    names = [f"{index:064x}.json" for index in range(3)]
    for age, name in enumerate(names):
        (tmp_path / name).write_text("{}")
        os.utime(tmp_path / name, ns=(1, 1_000_000_000 * (age + 1)))
    acc.touch_entry(str(tmp_path), names[0][:-5])
    assert acc.prune(str(tmp_path), keep=2) == [names[1]]
