"""Tests for plugins/module_utils/model_manifest.py on real directory trees in tmp_path."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import model_manifest as mm
from ansible_collections.dgx_spark.cluster.plugins.module_utils import stamp

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"
FILES = {
    "config.json": b'{"architectures": ["Qwen3MoeForCausalLM"]}',
    "tokenizer.json": b'{"model": {"type": "BPE"}}' * 10,
    "model-00001-of-00002.safetensors": b"\x00" * 4096,
    "model-00002-of-00002.safetensors": b"\x01" * 1000,
    "README.md": b"# not a model file",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def plain_model(root: Path) -> Path:
    root.mkdir(parents=True)
    for name, data in FILES.items():
        (root / name).write_bytes(data)
    return root


def hf_repo(root: Path, commit: str = COMMIT, ref: str | None = "main") -> Path:
    """The Hub's cache layout: blobs named by hash, snapshot entries as relative links."""
    (root / "blobs").mkdir(parents=True)
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, data in FILES.items():
        blob = root / "blobs" / sha(data)
        blob.write_bytes(data)
        (snap / name).symlink_to(os.path.relpath(blob, snap))
    if ref:
        (root / "refs").mkdir()
        (root / "refs" / ref).write_text(commit)
    return root


def expected_manifest(checksum: bool = True) -> dict:
    return {
        name: ({"size": len(data), "sha256": sha(data)} if checksum else {"size": len(data)})
        for name, data in FILES.items()
        if not name.endswith(".md")
    }


# --------------------------------------------------------------------------- layout


def test_absent_directory(tmp_path):
    assert mm.find_model_dir(str(tmp_path / "nope")) == (None, "absent")


def test_plain_directory(tmp_path):
    root = plain_model(tmp_path / "tiny")
    assert mm.find_model_dir(str(root)) == (str(root), "plain")


@pytest.mark.parametrize(
    ("revision", "ref", "want"),
    [
        ("main", "main", COMMIT),  # resolved through refs/main
        (COMMIT, None, COMMIT),  # a commit names its snapshot directly
        ("main", None, COMMIT),  # no refs: the only snapshot
    ],
)
def test_hf_cache_resolves_the_snapshot(tmp_path, revision, ref, want):
    root = hf_repo(tmp_path / "models--org--tiny", ref=ref)
    model_dir, layout = mm.find_model_dir(str(root), revision)
    assert layout == "hf_cache"
    assert model_dir == str(root / "snapshots" / want)


def test_hf_cache_with_two_snapshots_needs_a_revision(tmp_path):
    root = hf_repo(tmp_path / "models--org--tiny", ref=None)
    (root / "snapshots" / OTHER).mkdir()
    with pytest.raises(mm.ManifestError, match="2 snapshots"):
        mm.find_model_dir(str(root), "main")
    assert mm.find_model_dir(str(root), OTHER)[0] == str(root / "snapshots" / OTHER)


def test_ref_to_a_missing_snapshot_is_an_error(tmp_path):
    root = hf_repo(tmp_path / "models--org--tiny")
    (root / "refs" / "main").write_text(OTHER)
    with pytest.raises(mm.ManifestError, match=f"refs/main names commit '{OTHER}'"):
        mm.find_model_dir(str(root), "main")


@pytest.mark.parametrize(
    ("repo_id", "dirname"),
    [
        ("Qwen/Qwen3.5-122B-A10B-FP8", "models--Qwen--Qwen3.5-122B-A10B-FP8"),
        ("org/tiny_model", "models--org--tiny_model"),
    ],
)
def test_hf_repo_dirname(repo_id, dirname):
    assert mm.hf_repo_dirname(repo_id) == dirname


@pytest.mark.parametrize("repo_id", ["", "Qwen", "Qwen/", "/x", "a/b/c", "a b/c"])
def test_hf_repo_dirname_rejects(repo_id):
    with pytest.raises(mm.ManifestError):
        mm.hf_repo_dirname(repo_id)


# --------------------------------------------------------------------------- manifests


def test_plain_manifest_has_sizes_and_checksums_of_model_files(tmp_path):
    root = plain_model(tmp_path / "tiny")
    described = mm.build_manifest(str(root))
    assert described == {
        "files": expected_manifest(),
        "dangling": [],
        "escaping": [],
        "hashed": sorted(expected_manifest()),
        "reused": [],
    }
    assert mm.total_bytes(described["files"]) == sum(
        len(d) for n, d in FILES.items() if not n.endswith(".md")
    )


def test_size_only_manifest(tmp_path):
    root = plain_model(tmp_path / "tiny")
    assert mm.build_manifest(str(root), checksum=False)["files"] == expected_manifest(False)


def test_nested_files_are_included(tmp_path):
    root = plain_model(tmp_path / "tiny")
    (root / "original").mkdir()
    (root / "original" / "consolidated.safetensors").write_bytes(b"abc")
    files = mm.build_manifest(str(root), checksum=False)["files"]
    assert files["original/consolidated.safetensors"] == {"size": 3}


def test_hf_snapshot_manifest_follows_links_to_blobs(tmp_path):
    root = hf_repo(tmp_path / "models--org--tiny")
    model_dir = mm.find_model_dir(str(root))[0]
    described = mm.build_manifest(model_dir, root=str(root))
    # Same manifest as the plain copy: the links are followed to their blobs.
    assert described == {
        "files": expected_manifest(),
        "dangling": [],
        "escaping": [],
        "hashed": sorted(expected_manifest()),
        "reused": [],
    }


def test_snapshot_copied_without_blobs_has_dangling_links(tmp_path):
    """The rsync pitfall: the snapshot's links arrive, the blobs do not."""
    root = hf_repo(tmp_path / "models--org--tiny")
    for blob in (root / "blobs").iterdir():
        blob.unlink()
    model_dir = mm.find_model_dir(str(root))[0]
    described = mm.build_manifest(model_dir, root=str(root))
    assert described["files"] == {}
    # Every link is reported, including the one whose name is not a model pattern.
    assert described["dangling"] == sorted(FILES)
    problems = mm.compare(expected_manifest(), described)
    assert problems["dangling"] == sorted(FILES)
    assert problems["missing"] == []  # dangling, not silently "missing"
    assert problems["missing_bytes"] == mm.total_bytes(expected_manifest())
    assert not mm.is_clean(problems)
    assert "dangling symlinks, blobs not copied (5): README.md" in mm.describe(problems)


def test_snapshot_alone_has_links_escaping_it(tmp_path):
    """A snapshot directory as the copy's root: its links point outside what is copied."""
    root = hf_repo(tmp_path / "models--org--tiny")
    snap = root / "snapshots" / COMMIT
    described = mm.build_manifest(str(snap))
    assert described["escaping"] == sorted(FILES)
    assert described["files"] == expected_manifest()
    assert not mm.is_clean(mm.compare({}, described))


def test_directory_link_loops_are_walked_once(tmp_path):
    root = plain_model(tmp_path / "tiny")
    (root / "again").symlink_to(".")
    described = mm.build_manifest(str(root), checksum=False)
    assert described["files"] == expected_manifest(False)


# --------------------------------------------------------------------------- compare


def test_identical_copies_are_clean(tmp_path):
    head = mm.build_manifest(
        str(hf_repo(tmp_path / "head") / "snapshots" / COMMIT), root=str(tmp_path / "head")
    )
    worker = mm.build_manifest(str(plain_model(tmp_path / "worker")))
    problems = mm.compare(head["files"], worker)
    assert mm.is_clean(problems)
    assert problems["missing_bytes"] == 0
    assert mm.describe(problems) == ""


def test_missing_size_and_checksum_mismatches(tmp_path):
    root = plain_model(tmp_path / "tiny")
    (root / "tokenizer.json").unlink()
    (root / "model-00002-of-00002.safetensors").write_bytes(b"\x01" * 999)
    (root / "config.json").write_bytes(FILES["config.json"].replace(b"Qwen3", b"Qwen4"))
    problems = mm.compare(expected_manifest(), mm.build_manifest(str(root)))
    assert problems["missing"] == ["tokenizer.json"]
    assert problems["size_mismatch"] == [
        {"path": "model-00002-of-00002.safetensors", "expected": 1000, "actual": 999}
    ]
    assert [p["path"] for p in problems["checksum_mismatch"]] == ["config.json"]
    assert problems["missing_bytes"] == len(FILES["tokenizer.json"]) + 1000 + len(
        FILES["config.json"]
    )
    text = mm.describe(problems)
    assert "missing (1): tokenizer.json" in text
    assert "size differs (1): model-00002-of-00002.safetensors" in text
    assert "SHA-256 differs (1): config.json" in text


def test_checksums_are_ignored_in_size_mode(tmp_path):
    root = plain_model(tmp_path / "tiny")
    (root / "config.json").write_bytes(FILES["config.json"].replace(b"Qwen3", b"Qwen4"))
    assert mm.is_clean(
        mm.compare(expected_manifest(), mm.build_manifest(str(root), checksum=False), False)
    )
    # Expected entries without a checksum (a size-only source) compare sizes only.
    assert mm.is_clean(mm.compare(expected_manifest(False), mm.build_manifest(str(root))))


def test_extra_files_are_not_a_problem(tmp_path):
    root = plain_model(tmp_path / "tiny")
    (root / "extra.json").write_text("{}")
    assert mm.is_clean(mm.compare(expected_manifest(), mm.build_manifest(str(root))))


def test_nothing_present_needs_everything(tmp_path):
    problems = mm.compare(expected_manifest(), {"files": {}})
    assert problems["missing"] == sorted(expected_manifest())
    assert problems["missing_bytes"] == mm.total_bytes(expected_manifest())


def test_describe_limits_the_names():
    problems = mm.compare({f"m{i}.safetensors": {"size": 1} for i in range(8)}, {"files": {}})
    assert (
        mm.describe(problems, limit=2) == "missing (8): m0.safetensors, m1.safetensors and 6 more"
    )


# --------------------------------------------------------------------------- Hub


def hub_info(**overrides) -> dict:
    info = {
        "id": "Qwen/Qwen3.5-122B-A10B-FP8",
        "sha": COMMIT,
        "gated": False,
        "private": False,
        "siblings": [
            {"rfilename": ".gitattributes", "size": 1570, "blobId": "a" * 40},
            {"rfilename": "README.md", "size": 9000, "blobId": "b" * 40},
            {"rfilename": "config.json", "size": 2000, "blobId": "c" * 40},
            {
                "rfilename": "model-00001-of-00002.safetensors",
                "size": 135,
                "blobId": "d" * 40,
                "lfs": {"sha256": "e" * 64, "size": 4_000_000_000, "pointerSize": 135},
            },
            {
                "rfilename": "model-00002-of-00002.safetensors",
                "size": 135,
                "blobId": "f" * 40,
                "lfs": {"sha256": "1" * 64, "size": 1_000_000_000, "pointerSize": 135},
            },
        ],
    }
    info.update(overrides)
    return info


def test_hub_info_becomes_a_manifest_with_lfs_checksums():
    got = mm.hf_manifest_from_api(hub_info())
    assert got["commit"] == COMMIT
    assert got["gated"] is False
    assert got["files"] == {
        "config.json": {"size": 2000},
        "model-00001-of-00002.safetensors": {"size": 4_000_000_000, "sha256": "e" * 64},
        "model-00002-of-00002.safetensors": {"size": 1_000_000_000, "sha256": "1" * 64},
    }
    assert got["total_bytes"] == 5_000_002_000


@pytest.mark.parametrize(("gated", "want"), [(False, False), ("auto", True), ("manual", True)])
def test_hub_gated_flag(gated, want):
    assert mm.hf_manifest_from_api(hub_info(gated=gated))["gated"] is want


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sha": None}, "no commit hash"),
        ({"sha": "main"}, "no commit hash"),
        (
            {"siblings": [{"rfilename": "config.json", "blobId": "c" * 40}]},
            "no size for config.json",
        ),
        ({"siblings": [{"rfilename": "README.md", "size": 1}]}, "no model files"),
    ],
)
def test_hub_info_errors(overrides, message):
    with pytest.raises(mm.ManifestError, match=message):
        mm.hf_manifest_from_api(hub_info(**overrides))


def test_hub_download_is_verified_against_the_lfs_checksum(tmp_path):
    """A head copy whose blob differs from the Hub's SHA-256 fails the check."""
    root = tmp_path / "m"
    root.mkdir()
    (root / "model.safetensors").write_bytes(b"abc")
    expected = {"model.safetensors": {"size": 3, "sha256": "0" * 64}}
    problems = mm.compare(expected, mm.build_manifest(str(root)))
    assert [p["path"] for p in problems["checksum_mismatch"]] == ["model.safetensors"]


# --------------------------------------------------------------------------- preflight

GIB = 1024**3


@pytest.mark.parametrize(
    ("model_bytes", "memory", "fraction", "fits"),
    [
        (
            119 * 10**9,
            {"spark-1": 119 * GIB, "spark-2": 119 * GIB},
            0.8,
            True,
        ),  # the production pair
        (119 * 10**9, {"spark-1": 119 * GIB}, 0.8, False),  # one Spark cannot hold it
        (
            119 * 10**9,
            {"spark-1": 119 * GIB, "spark-2": 60 * GIB},
            0.8,
            False,
        ),  # smallest node bounds it
        (
            13_253,
            {"spark-1": 24 * GIB, "spark-2": 24 * GIB},
            1e-7,
            False,
        ),  # the sim's tiny model, tiny limit
        (13_253, {"spark-1": 24 * GIB, "spark-2": 24 * GIB}, 0.8, True),
    ],
)
def test_capacity(model_bytes, memory, fraction, fits):
    errors = mm.check_capacity(model_bytes, memory, fraction)
    assert (errors == []) is fits
    if not fits:
        assert "model_cache_max_fraction_of_memory" in errors[0]


@pytest.mark.parametrize("fraction", [0, -0.5, 1.5])
def test_capacity_rejects_bad_fractions(fraction):
    (error,) = mm.check_capacity(1, {"a": GIB}, fraction)
    assert error.startswith("model_cache_max_fraction_of_memory must be above 0")


def test_capacity_counts_the_profiles_kv_cache_beside_the_weights():
    """119 GB of weights fit 0.8 of two 113 GiB nodes; 80 GiB of KV cache more do not, and the
    refusal names where that figure comes from."""
    memory = {"spark-1": 113 * GIB, "spark-2": 113 * GIB}
    assert mm.check_capacity(119_000_000_000, memory, 0.8, 26 * GIB) == []
    (error,) = mm.check_capacity(119_000_000_000, memory, 0.8, 80 * GIB)
    assert "its KV cache needs 80.0 GiB (model_cache_kv_cache_gib, from the profile)" in error


def test_capacity_needs_memory_facts():
    assert "memtotal_mb" in mm.check_capacity(1, {}, 0.8)[0]


def test_disk():
    assert mm.check_disk("spark-2", "/m", free_bytes=10, missing_bytes=10) == []
    (error,) = mm.check_disk("spark-2", "/m", free_bytes=10 * GIB, missing_bytes=119 * GIB)
    assert error.startswith("spark-2: model_cache_dir (/m) has 10.0 GiB free")
    assert "119.0 GiB" in error


def test_free_bytes_of_a_path_not_yet_made(tmp_path):
    probe, free = mm.free_bytes(str(tmp_path / "a" / "b"))
    assert probe == str(tmp_path)
    assert free > 0


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (13_253, "12.9 KiB"),
        (119 * 10**9, "110.8 GiB"),
    ],
)
def test_human_bytes(n, text):
    assert mm.human_bytes(n) == text


# --------------------------------------------------------------------------- rsync

# Captured from rsync 3.2.7 (Debian bookworm): spark-1 pushing the tiny model to spark-2
# over the fast link, then again.
RSYNC_FIRST = """\
created directory /tmp/rs-capture
cd+++++++++ ./
<f+++++++++ .inputs
<f+++++++++ config.json
<f+++++++++ generation_config.json
<f+++++++++ tokenizer.json
<f+++++++++ tokenizer_config.json

Number of files: 6 (reg: 5, dir: 1)
Number of created files: 6 (reg: 5, dir: 1)
Number of deleted files: 0
Number of regular files transferred: 5
Total file size: 13269 bytes
Total transferred file size: 13269 bytes
Literal data: 13269 bytes
Matched data: 0 bytes
File list size: 0
File list generation time: 0.001 seconds
File list transfer time: 0.000 seconds
Total bytes sent: 13697
Total bytes received: 163

sent 13697 bytes  received 163 bytes  9240.00 bytes/sec
total size is 13269  speedup is 0.96
"""

RSYNC_AGAIN = """\

Number of files: 6 (reg: 5, dir: 1)
Number of created files: 0
Number of deleted files: 0
Number of regular files transferred: 0
Total file size: 13269 bytes
Total transferred file size: 0 bytes
Literal data: 0 bytes
Matched data: 0 bytes
File list size: 0
File list generation time: 0.001 seconds
File list transfer time: 0.000 seconds
Total bytes sent: 202
Total bytes received: 19

sent 202 bytes  received 19 bytes  442.00 bytes/sec
total size is 13269  speedup is 60.04
"""

# Made up to cover the other item kinds and rsync's default thousands separators.
RSYNC_LINKS_AND_DELETES = """\
*deleting   snapshots/old/config.json
.d..t...... snapshots/
cL+++++++++ snapshots/c0ffee/config.json -> ../../blobs/771350d7
>f.st...... blobs/771350d7

Number of regular files transferred: 1
Total file size: 1,234,567 bytes
Total transferred file size: 1,234,567 bytes
Literal data: 1,000 bytes
Matched data: 1,233,567 bytes
Total bytes sent: 2,000
"""


def test_rsync_first_push():
    got = mm.parse_rsync(RSYNC_FIRST)
    assert got["changed"] is True
    assert len(got["changes"]) == 6
    assert got["literal_bytes"] == 13269
    assert got["files_transferred"] == 5


def test_rsync_rerun_moves_nothing():
    got = mm.parse_rsync(RSYNC_AGAIN)
    assert got == {
        "changes": [],
        "changed": False,
        "files_transferred": 0,
        "transferred_bytes": 0,
        "literal_bytes": 0,
        "bytes_sent": 202,
        "total_bytes": 13269,
    }


def test_rsync_links_deletions_and_separators():
    got = mm.parse_rsync(RSYNC_LINKS_AND_DELETES)
    assert [c.split()[0] for c in got["changes"]] == [
        "*deleting",
        ".d..t......",
        "cL+++++++++",
        ">f.st......",
    ]
    assert got["total_bytes"] == 1_234_567
    assert got["literal_bytes"] == 1000


def test_rsync_without_stats_is_an_error():
    with pytest.raises(mm.ManifestError, match="--stats"):
        mm.parse_rsync(">f+++++++++ config.json\n")


# --------------------------------------------------------------------------- verification record


def test_first_placement_hashes_every_file_and_keeps_mtimes(tmp_path):
    root = plain_model(tmp_path / "m")
    described = mm.build_manifest(str(root), known={})
    assert described["hashed"] == sorted(expected_manifest())
    assert described["reused"] == []
    for rel, entry in described["files"].items():
        assert entry["sha256"] == expected_manifest()[rel]["sha256"]
        assert entry["mtime_ns"] == os.stat(root / rel).st_mtime_ns


def test_unchanged_files_reuse_the_record_and_changed_ones_are_read(tmp_path):
    root = plain_model(tmp_path / "m")
    record = mm.build_manifest(str(root), known={})["files"]
    again = mm.build_manifest(str(root), known=record)
    assert again["hashed"] == [] and sorted(again["reused"]) == sorted(record)
    assert again["files"] == record

    # Same size, new content and a new modification time: read again, and caught.
    shard = root / "model-00002-of-00002.safetensors"
    shard.write_bytes(b"\x02" * 1000)
    os.utime(shard, ns=(1, record[shard.name]["mtime_ns"] + 1_000_000_000))
    changed = mm.build_manifest(str(root), known=record)
    assert changed["hashed"] == [shard.name]
    problems = mm.compare(record, changed)
    assert [p["path"] for p in problems["checksum_mismatch"]] == [shard.name]


def test_a_record_is_not_trusted_without_mtime_or_checksum(tmp_path):
    root = plain_model(tmp_path / "m")
    record = mm.build_manifest(str(root), known={})["files"]
    no_mtime = {rel: {k: v for k, v in e.items() if k != "mtime_ns"} for rel, e in record.items()}
    no_sha = {rel: {k: v for k, v in e.items() if k != "sha256"} for rel, e in record.items()}
    for known in (no_mtime, no_sha):
        assert mm.build_manifest(str(root), known=known)["reused"] == []


def test_without_known_nothing_changes_in_the_manifest(tmp_path):
    root = plain_model(tmp_path / "m")
    assert mm.build_manifest(str(root))["files"] == expected_manifest()


STAMP = {"name": "weights-m", "inputs": {"model_dir": "/m"}, "passed_at": "2026-12-06T10:00:00Z",
         "result": {"files": {"a.json": {"size": 1}}}, "format": 1}  # fmt: skip
NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "files"),
    [
        (json.dumps(STAMP), {"a.json": {"size": 1}}),
        # An older collection's own record, another format, something unreadable: none.
        ('{"format": 1, "files": {"a.json": {"size": 1}}}', {}),
        (json.dumps({**STAMP, "format": 2}), {}),
        ("not json", {}),
        ("[]", {}),
        (json.dumps({**STAMP, "result": {"files": []}}), {}),
    ],
)
def test_read_record(text, files):
    assert mm.read_record(text) == files


def test_the_weights_stamp_reads_back_for_its_own_directory_only():
    files = {"model.safetensors": {"size": 3, "sha256": "ab", "mtime_ns": 1}}
    made = stamp.make("weights-tiny", {"model_dir": "/models/tiny"}, {"files": files}, NOW)
    assert mm.read_record(json.dumps(made), "/models/tiny") == files
    assert mm.read_record(json.dumps(made), "/other/tiny") == {}


# --------------------------------------------------------------------------- stale copies


def test_mtimes_alone_put_the_time_in_every_entry(tmp_path):
    root = plain_model(tmp_path / "tiny")
    plain = mm.build_manifest(str(root), checksum=False)["files"]
    timed = mm.build_manifest(str(root), checksum=False, mtimes=True)["files"]
    assert all("mtime_ns" not in entry for entry in plain.values())
    assert {name: entry["mtime_ns"] for name, entry in timed.items()} == {
        name: (root / name).stat().st_mtime_ns for name in plain
    }


def test_a_copy_written_after_its_source_is_current(tmp_path):
    source = plain_model(tmp_path / "source")
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    for path in source.iterdir():
        os.utime(path, ns=(10**18, 10**18))
    for path in copy.iterdir():
        os.utime(path, ns=(2 * 10**18, 2 * 10**18))
    want = mm.build_manifest(str(source), checksum=False, mtimes=True)["files"]
    have = mm.build_manifest(str(copy), checksum=False, mtimes=True)["files"]
    assert mm.stale(want, have) == []


def test_missing_resized_and_newer_source_files_are_stale():
    entry = {"size": 10, "mtime_ns": 100}
    source = {"a": entry, "b": entry, "c": entry, "d": entry, "e": entry, "f": {"size": 10}}
    copy = {
        "b": {"size": 11, "mtime_ns": 200},  # another size
        "c": {"size": 10, "mtime_ns": 99},  # written before the source last changed
        "d": {"size": 10, "mtime_ns": 100},  # the same time: current
        "e": {"size": 10},  # no time to compare: copied again
        "f": {"size": 10, "mtime_ns": 300},  # the source has no time: copied again
    }
    assert mm.stale(source, copy) == ["a", "b", "c", "e", "f"]
