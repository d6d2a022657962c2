"""collection_digest: one digest that moves with any file the collection runs, and only those."""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.lookup import collection_digest


def tree(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


FILES = {"roles/a/tasks/main.yml": "x", "plugins/modules/m.py": "y", "deploy.yml": "z",
         "playbooks/p.yml": "p"}  # fmt: skip


def test_the_same_tree_gives_the_same_digest(tmp_path):
    tree(tmp_path / "one", FILES)
    tree(tmp_path / "two", FILES)
    assert collection_digest.tree_digest(str(tmp_path / "one")) == collection_digest.tree_digest(
        str(tmp_path / "two")
    )


def test_a_changed_or_renamed_file_moves_it_and_caches_do_not(tmp_path):
    tree(tmp_path, FILES)
    before = collection_digest.tree_digest(str(tmp_path))
    tree(tmp_path, {"roles/a/tasks/__pycache__/x.pyc": "cache", "README.md": "docs",
                    "plugins/modules/m.pyc": "c"})  # fmt: skip
    assert collection_digest.tree_digest(str(tmp_path)) == before
    tree(tmp_path, {"roles/a/tasks/main.yml": "x2"})
    changed = collection_digest.tree_digest(str(tmp_path))
    assert changed != before
    (tmp_path / "roles/a/tasks/main.yml").rename(tmp_path / "roles/a/tasks/other.yml")
    assert collection_digest.tree_digest(str(tmp_path)) not in (before, changed)


def test_the_lookup_digests_this_collection():
    assert collection_digest.LookupModule().run([]) == [
        collection_digest.tree_digest(collection_digest.__file__.rsplit("/plugins/", 1)[0])
    ]
