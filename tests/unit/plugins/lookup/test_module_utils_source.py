"""module_utils_source gives a module_utils file's text as the collection loader finds it, and
refuses what is not one of them."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleLookupError
from ansible_collections.dgx_spark.cluster.plugins.lookup import module_utils_source as lookup

MODULE_UTILS = Path(__file__).resolve().parents[4] / "plugins" / "module_utils"


def test_the_text_is_the_file_s():
    got = lookup.LookupModule().run(["vllm_log", "vllm_metrics"])
    assert got == [
        (MODULE_UTILS / "vllm_log.py").read_text(encoding="utf-8"),
        (MODULE_UTILS / "vllm_metrics.py").read_text(encoding="utf-8"),
    ]


@pytest.mark.parametrize("name", ["../lookup/collection_digest", "vllm_log.py", "", "nothing_here"])
def test_anything_else_is_refused_naming_it(name):
    with pytest.raises(AnsibleLookupError, match="module_utils_source: "):
        lookup.source(name)
