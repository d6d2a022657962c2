"""Tests for plugins/module_utils/nccl_choice.py: which libnccl the ranks load, from the serving
image's NCCL version and each node's, for spark_nccl_library auto, image and host.

The versions are the ones public reports and this project's captures show: 2.28.9 in the pip
wheel and in DGX OS's libnccl2 (vLLM issues 42354 and 41725; the NCCL init line of
all_gather_perf_spark_ib.txt), 2.28.3 in the device machine's system NCCL (the h200x2
captures), 2.30.7 the version recommended for GB10 pairs, 2.29.7 DGX OS's apt libnccl2 in
NVIDIA/nccl issue 2167."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import nccl_choice as nc

PAIR = ("spark-1", "spark-2")


def hosts(*versions):
    return dict(zip(PAIR, versions, strict=True))


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("2.28.9", (2, 28, 9)),
        ("2.28.9+cuda13.0", (2, 28, 9)),
        # nccl_versions.yml's probe prints the version, then where the library lies.
        ("2.28.9 from /usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2",
         (2, 28, 9)),
        ("none in torch (AttributeError: a CPU build has no NCCL)", None),
        ("", None),
        (None, None),
    ],
)  # fmt: skip
def test_versions_are_read_from_what_preflight_prints(text, version):
    assert nc.version_tuple(text) == version


def test_the_node_version_comes_from_the_library_file_name():
    assert nc.file_version("/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9") == "2.28.9"
    assert nc.file_version("/usr/lib/aarch64-linux-gnu/libnccl.so.2") == ""


@pytest.mark.parametrize(
    ("version", "hang"),
    [("2.28.0", True), ("2.28.3", True), ("2.28.9", True), ("2.27.7", False), ("2.29.7", False),
     ("2.30.7", False), (None, False)],
)  # fmt: skip
def test_the_hang_range_is_2_28(version, hang):
    assert nc.in_hang_range(version) is hang


def test_auto_takes_the_nodes_newer_nccl_over_the_image_2_28():
    result = nc.choose("2.28.9+cuda13.0", hosts("2.30.7", "2.30.7"), "auto")
    assert result["passed"] and result["library"] == "host"
    assert result["message"].startswith(
        "spark_nccl_library: auto chose the nodes' NCCL 2.30.7 over the image's 2.28.9: NCCL 2.28.x"
    )
    assert "vLLM issues 42354 and 41725" in result["message"]
    assert result["hosts"] == {"spark-1": "2.30.7", "spark-2": "2.30.7"}


def test_auto_keeps_an_image_outside_the_range():
    result = nc.choose("2.30.7", hosts("2.28.9", "2.28.9"), "auto")
    assert result["passed"] and result["library"] == "image" and result["warnings"] == []
    assert "outside the 2.28.x range" in result["message"]


def test_auto_keeps_an_image_without_nccl_as_on_the_simulated_pair():
    # The sim's serving image is a CPU build (its torch has no NCCL) and its nodes have none.
    result = nc.choose("none in torch (AttributeError: a CPU build has no NCCL)",
                       hosts(None, None), "auto")  # fmt: skip
    assert result["passed"] and result["library"] == "image"
    assert "unknown (no NCCL in its torch)" in result["message"]


def test_auto_refuses_when_no_node_offers_a_way_out_of_the_range():
    # DGX OS's libnccl2 and the pip wheel both report 2.28.9 (vLLM issue 42354).
    result = nc.choose("2.28.9", hosts("2.28.9", "2.28.9"), "auto")
    assert not result["passed"] and result["library"] is None
    message = result["message"]
    assert "no node offers one newer and outside that range" in message
    assert "spark_nccl_library: host" in message and "spark_nccl_library: image" in message
    assert "https://github.com/vllm-project/vllm/issues/42354" in message
    assert "NCCL >= 2.30.7" in message


@pytest.mark.parametrize(
    ("nodes", "why"),
    [
        (hosts("2.30.7", None), "no node offers one newer"),  # one node has no libnccl
        (hosts("2.30.7", "2.28.9"), "no node offers one newer"),  # one node is in the range too
        (hosts("2.27.7", "2.27.7"), "no node offers one newer"),  # outside, but older
        (hosts("2.30.7", "2.29.7"), "the nodes offer different versions"),
    ],
)
def test_auto_refuses_unless_every_node_offers_the_same_newer_version(nodes, why):
    result = nc.choose("2.28.9", nodes, "auto")
    assert not result["passed"] and result["library"] is None
    assert why in result["message"]


def test_image_stands_when_chosen_explicitly_with_a_warning_in_the_range():
    result = nc.choose("2.28.9", hosts("2.28.9", "2.28.9"), "image")
    assert result["passed"] and result["library"] == "image"
    assert result["warnings"] == [
        "the ranks load the image's NCCL 2.28.9: NCCL 2.28.x has public reports of TP=2 ranks "
        "wedging in a collective on two GB10 Sparks (vLLM issues 42354 and 41725; NCCL >= 2.30.7 "
        "recommended)"
    ]
    assert nc.choose("2.30.7", hosts(None, None), "image")["warnings"] == []


def test_host_stands_when_chosen_explicitly_with_a_warning_in_the_range():
    result = nc.choose("2.28.9", hosts("2.28.9", "2.28.9"), "host")
    assert result["passed"] and result["library"] == "host"
    assert [w.split(":")[0] for w in result["warnings"]] == [
        "spark-1 loads its own NCCL 2.28.9",
        "spark-2 loads its own NCCL 2.28.9",
    ]
    mixed = nc.choose("2.28.9", hosts("2.30.7", "2.29.7"), "host")
    assert mixed["passed"] and mixed["warnings"][-1].startswith("the nodes' NCCL versions differ")


def test_host_is_refused_on_a_node_without_libnccl():
    result = nc.choose("2.28.9", hosts("2.30.7", None), "host")
    assert not result["passed"] and result["library"] is None
    assert result["message"].startswith("spark_nccl_library: host, but spark-2 has no libnccl")


def test_an_unknown_mode_is_an_error():
    with pytest.raises(ValueError, match="one of auto, image, host"):
        nc.choose("2.28.9", hosts("2.30.7", "2.30.7"), "newest")


def test_pair_auto_waits_while_a_node_lacks_the_serving_image():
    # On a first deploy preflight runs before the images stage builds the serving image.
    result = nc.choose_pair({"spark-1": "2.28.9", "spark-2": None}, hosts("2.30.7", "2.30.7"))
    assert result["passed"] and result["pending"] and result["library"] is None
    assert "the image is not on spark-2 (the images stage builds it)" in result["message"]
    assert result["hosts"] == {"spark-1": "2.30.7", "spark-2": "2.30.7"}


def test_pair_explicit_choice_does_not_wait_for_the_image():
    result = nc.choose_pair({"spark-1": None, "spark-2": None}, hosts("2.28.9", "2.28.9"), "host")
    assert result["passed"] and not result["pending"] and result["library"] == "host"


@pytest.mark.parametrize(
    ("image", "nodes", "library"),
    [
        ("2.28.9 from /usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2",
         hosts("2.30.7", "2.30.7"), "host"),
        ("2.30.7", hosts("2.28.9", "2.28.9"), "image"),
        ("2.28.9", hosts("2.28.9", "2.28.9"), None),
    ],
)  # fmt: skip
def test_pair_decides_as_choose_when_every_node_reports_the_same_image(image, nodes, library):
    result = nc.choose_pair({"spark-1": image, "spark-2": image}, nodes)
    assert result["library"] == library and result["passed"] is (library is not None)
    assert result["pending"] is False


def test_pair_auto_refuses_images_that_differ_between_nodes():
    images = {"spark-1": "2.28.9", "spark-2": "2.30.7"}
    result = nc.choose_pair(images, hosts("2.30.7", "2.30.7"))
    assert not result["passed"] and result["library"] is None
    assert "differs between the nodes (spark-1's 2.28.9, spark-2's 2.30.7)" in result["message"]
    explicit = nc.choose_pair(images, hosts("2.30.7", "2.30.7"), "image")
    assert explicit["passed"] and explicit["library"] == "image"
    assert explicit["warnings"][-1].startswith("the serving image's NCCL differs between the nodes")
