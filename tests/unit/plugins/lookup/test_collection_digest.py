"""collection_digest: one digest that moves with any file the collection runs, and only those.

The expected digests are computed here from the rule the plugin documents (hashlib over the
sorted relative paths, each path, a NUL byte and its contents' SHA-256), never with
``tree_digest`` itself."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ansible_collections.dgx_spark.cluster.plugins.lookup import collection_digest

RUN = ("roles", "plugins", "playbooks")


def tree(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def by_the_rule(files: dict[str, bytes]) -> str:
    """The documented digest of ``{relative path: contents}``."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return digest.hexdigest()


FILES = {"roles/a/tasks/main.yml": "x", "plugins/modules/m.py": "y", "deploy.yml": "z",
         "playbooks/p.yml": "p"}  # fmt: skip


def test_a_small_tree_gives_the_documented_digest(tmp_path):
    tree(tmp_path, FILES)
    # In path order: deploy.yml, playbooks/p.yml, plugins/modules/m.py, roles/a/tasks/main.yml.
    expected = hashlib.sha256(
        b"deploy.yml\0" + hashlib.sha256(b"z").digest()
        + b"playbooks/p.yml\0" + hashlib.sha256(b"p").digest()
        + b"plugins/modules/m.py\0" + hashlib.sha256(b"y").digest()
        + b"roles/a/tasks/main.yml\0" + hashlib.sha256(b"x").digest()
    ).hexdigest()  # fmt: skip
    assert collection_digest.tree_digest(str(tmp_path)) == expected
    assert expected == by_the_rule({k: v.encode() for k, v in FILES.items()})


def test_caches_and_other_files_do_not_count_a_change_or_rename_does(tmp_path):
    tree(tmp_path, FILES)
    tree(tmp_path, {"roles/a/tasks/__pycache__/x.pyc": "cache", "README.md": "docs",
                    "plugins/modules/m.pyc": "c", "tests/t.py": "t"})  # fmt: skip
    files = {k: v.encode() for k, v in FILES.items()}
    assert collection_digest.tree_digest(str(tmp_path)) == by_the_rule(files)
    tree(tmp_path, {"roles/a/tasks/main.yml": "x2"})
    files["roles/a/tasks/main.yml"] = b"x2"
    assert collection_digest.tree_digest(str(tmp_path)) == by_the_rule(files)
    (tmp_path / "roles/a/tasks/main.yml").rename(tmp_path / "roles/a/tasks/other.yml")
    files["roles/a/tasks/other.yml"] = files.pop("roles/a/tasks/main.yml")
    assert collection_digest.tree_digest(str(tmp_path)) == by_the_rule(files)


def test_the_lookup_digests_this_collection():
    root = Path(collection_digest.__file__).resolve().parents[2]
    files = {"deploy.yml": (root / "deploy.yml").read_bytes()}
    for part in RUN:
        for path in (root / part).rglob("*"):
            relative = path.relative_to(root)
            if path.is_file() and "__pycache__" not in relative.parts and path.suffix != ".pyc":
                files[relative.as_posix()] = path.read_bytes()
    assert len(files) > 100  # the roles, plugins and playbooks are all there
    assert collection_digest.LookupModule().run([]) == [by_the_rule(files)]
