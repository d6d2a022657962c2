"""Tests for plugins/module_utils/nccl_choice.py: which libnccl the ranks load, from the serving
image's NCCL (version and build) and each node's, for spark_nccl_library auto, image and host.

The versions are the ones public reports and this project's captures show: 2.28.9 in the pip
wheel and in DGX OS's libnccl2 (vLLM issues 42354 and 41725; the NCCL init line of
all_gather_perf_spark_ib.txt), 2.28.3 in the device machine's system NCCL (the h200x2
captures), 2.30.7 the version recommended for GB10 pairs, 2.29.7 DGX OS's apt libnccl2 in
NVIDIA/nccl issue 2167. The builds: the public reports give the first eight hex digits of the
two 2.28.9 builds' ELF build IDs and their sizes (219 MB the wheel's, 190 MB DGX OS's); the rest
of each ID here is made up, and so are the IDs of the other builds."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import nccl_choice as nc

PAIR = ("spark-1", "spark-2")
WHEEL = "/usr/local/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2"
DGX_OS = "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.9"


def build(build_id=None, size=None, path=WHEEL, sha256=None):
    return {"path": path, "real_path": path, "size": size, "build_id": build_id,
            "sha256": sha256, "error": None}  # fmt: skip


PIP_2289 = build("a7f420a1" + "5e" * 16, 219_000_000)
DGX_2289 = build("c0db9360" + "17" * 16, 190_000_000, DGX_OS)
OTHER_2289 = build("5eed0001" + "00" * 16, 191_000_000, DGX_OS)
WHEEL_2283 = build("2283aaaa" + "00" * 16, 207_000_000)
SYSTEM_2283 = build(
    "2283bbbb" + "00" * 16, 180_000_000, "/usr/lib/aarch64-linux-gnu/libnccl.so.2.28.3"
)
APT_2289 = build("deadbeef" + "00" * 16, 189_000_000, "/usr/lib/x86_64-linux-gnu/libnccl.so.2.28.9")
NEW_2307 = build(
    "2307cccc" + "00" * 16, 200_000_000, "/usr/lib/aarch64-linux-gnu/libnccl.so.2.30.7"
)
OLD_2277 = build(
    "2277dddd" + "00" * 16, 170_000_000, "/usr/lib/aarch64-linux-gnu/libnccl.so.2.27.7"
)
HASHED_2289 = build(None, 190_500_000, DGX_OS, sha256="ab" * 32)


def hosts(*versions):
    return dict(zip(PAIR, versions, strict=True))


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("2.28.9", (2, 28, 9)),
        ("2.28.9+cuda13.0", (2, 28, 9)),
        ("2.28.9 (the nvidia-nccl-cu13 wheel; torch has none)", (2, 28, 9)),
        ("none in torch (AttributeError: a CPU build has no NCCL)", None),
        ("", None),
        (None, None),
    ],
)
def test_versions_are_read_from_what_the_probe_prints(text, version):
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


@pytest.mark.parametrize(
    ("found", "entry"),
    [(PIP_2289, nc.HANGS), (DGX_2289, nc.CLEAN), (OTHER_2289, None), (HASHED_2289, None),
     (None, None)],
)  # fmt: skip
def test_builds_are_known_by_the_first_eight_hex_digits_of_their_id(found, entry):
    assert (nc.known_build(found) or {}).get("verdict") == entry


# The decision table of auto: the image's (version, build) and every node's (version, build) ->
# the library the ranks load (None: refused) and the words that say why.
AUTO = [
    # vLLM issues 41725 and 42354: the wheel's 2.28.9 in the image, DGX OS's on the node.
    ("2.28.9", PIP_2289, "2.28.9", DGX_2289, "host",
     "the nodes' is DGX OS's libnccl2 build, with which a TP=2 pair of Sparks ran a 60-minute "
     "soak clean"),
    # The same build on both sides is no way out, known bad or not.
    ("2.28.9", PIP_2289, "2.28.9", PIP_2289, None,
     "on spark-1 and spark-2, the pip wheel nvidia-nccl-cu13's build, which has hang reports too"),
    ("2.28.3", WHEEL_2283, "2.28.3", WHEEL_2283, None, "the same build as the image's (2283aaaa)"),
    # Newer and outside the range, as before builds were weighed.
    ("2.28.9", PIP_2289, "2.30.7", NEW_2307, "host", "the nodes' is newer and outside"),
    ("2.28.9", None, "2.30.7", None, "host", "the nodes' is newer and outside"),
    # A wheel's build in the range against any other build of at least its version: the fix.
    ("2.28.9", PIP_2289, "2.28.9", OTHER_2289, "host", "another build than the pip wheel's"),
    ("2.28.3", WHEEL_2283, "2.28.3", SYSTEM_2283, "host", "another build than the pip wheel's"),
    ("2.28.9", PIP_2289, "2.28.9", HASHED_2289, "host", "another build than the pip wheel's"),
    ("2.28.3", WHEEL_2283, "2.28.9", DGX_2289, "host", "the nodes' is DGX OS's libnccl2 build"),
    # An image whose library is not a wheel's: only a build known clean or a newer one helps.
    ("2.28.9", APT_2289, "2.28.9", OTHER_2289, None, "a build not known to run clean"),
    ("2.28.9", APT_2289, "2.28.9", DGX_2289, "host", "the nodes' is DGX OS's libnccl2 build"),
    # Nothing known good on offer.
    ("2.28.9", PIP_2289, "2.27.7", OLD_2277, None, "2.27.7, older than the image's"),
    ("2.28.9", PIP_2289, "2.28.9", None, None,
     "on spark-1 and spark-2, 2.28.9, whose build was not read"),
    ("2.28.9", PIP_2289, None, None, None, "no libnccl whose version its file name says"),
    # The image's own library is fine: kept.
    ("2.28.9", DGX_2289, "2.30.7", NEW_2307, "image", "its build is DGX OS's libnccl2 build"),
    ("2.30.7", NEW_2307, "2.28.9", DGX_2289, "image", "its version is outside the 2.28.x range"),
    ("none in torch (AttributeError: a CPU build has no NCCL)", None, None, None, "image",
     "its version is unknown (no NCCL in its torch)"),
]  # fmt: skip


@pytest.mark.parametrize(("image", "ibuild", "node", "nbuild", "library", "why"), AUTO)
def test_auto_decides_from_versions_and_builds(image, ibuild, node, nbuild, library, why):
    result = nc.choose(image, hosts(node, node), "auto", ibuild, hosts(nbuild, nbuild))
    assert result["library"] == library and result["passed"] is (library is not None)
    assert why in result["message"], result["message"]
    if library is None:
        assert result["message"].startswith("spark_nccl_library: auto refuses to start the ranks")
        assert "https://github.com/vllm-project/vllm/issues/42354" in result["message"]


def test_auto_names_every_build_it_weighed():
    result = nc.choose("2.28.9+cuda13.0", hosts("2.28.9", "2.28.9"), "auto", PIP_2289,
                       hosts(DGX_2289, DGX_2289))  # fmt: skip
    assert result["message"].startswith(
        "spark_nccl_library: auto chose the nodes' NCCL 2.28.9 over the image's 2.28.9: its build "
        "is the pip wheel nvidia-nccl-cu13's build, with which TP=2 ranks on two Sparks hit the "
        "watchdog timeout at ~20 minutes"
    )
    assert (
        f"(the image's NCCL 2.28.9 (219.0 MB, build a7f420a1, {WHEEL}: the pip wheel "
        "nvidia-nccl-cu13's build); "
        f"spark-1's 2.28.9 (190.0 MB, build c0db9360, {DGX_OS}: DGX OS's libnccl2 build), "
        f"spark-2's 2.28.9 (190.0 MB, build c0db9360, {DGX_OS}: DGX OS's libnccl2 build))"
    ) in result["message"]
    assert result["image_build"]["build_id"].startswith("a7f420a1")
    assert result["host_builds"]["spark-2"]["size"] == 190_000_000


def test_auto_refusal_names_the_builds_and_the_way_out():
    result = nc.choose("2.28.9", hosts("2.28.9", "2.28.9"), "auto", PIP_2289,
                       hosts(PIP_2289, PIP_2289))  # fmt: skip
    message = result["message"]
    assert "nothing known good is on offer: on spark-1 and spark-2, the pip wheel" in message
    assert "build a7f420a1" in message and "219.0 MB" in message
    assert "DGX OS's libnccl2 (its 2.28.9 build c0db9360 ran clean)" in message
    assert "NCCL >= 2.30.7" in message
    assert "spark_nccl_library: host" in message and "spark_nccl_library: image" in message


@pytest.mark.parametrize(
    ("nodes", "builds", "why"),
    [
        (hosts("2.30.7", None), hosts(NEW_2307, None), "on spark-2, no libnccl"),
        (hosts("2.30.7", "2.28.9"), hosts(NEW_2307, PIP_2289), "on spark-2, the pip wheel"),
        (hosts("2.30.7", "2.29.7"), hosts(None, None), "the nodes offer different versions"),
        (hosts("2.28.9", "2.28.9"), hosts(DGX_2289, OTHER_2289), "different versions or builds"),
    ],
)
def test_auto_refuses_unless_every_node_offers_the_same_good_library(nodes, builds, why):
    result = nc.choose("2.28.9", nodes, "auto", PIP_2289, builds)
    assert not result["passed"] and result["library"] is None
    assert why in result["message"]


def test_a_known_build_names_its_version_where_the_file_name_does_not():
    # A libnccl.so.2 that is a plain file, not a link to a versioned name.
    dgx = {**DGX_2289, "path": "/usr/lib/aarch64-linux-gnu/libnccl.so.2"}
    result = nc.choose("2.28.9", hosts("", ""), "auto", PIP_2289, hosts(dgx, dgx))
    assert result["library"] == "host" and result["hosts"] == hosts("2.28.9", "2.28.9")


def test_image_stands_when_chosen_explicitly_with_a_warning_in_the_range():
    result = nc.choose("2.28.9", hosts("2.28.9", "2.28.9"), "image")
    assert result["passed"] and result["library"] == "image"
    assert result["warnings"] == [
        "the ranks load the image's NCCL 2.28.9: NCCL 2.28.x has public reports of TP=2 ranks "
        "wedging in a collective on two GB10 Sparks (vLLM issues 42354 and 41725; NCCL >= 2.30.7 "
        "recommended)"
    ]
    assert nc.choose("2.30.7", hosts(None, None), "image")["warnings"] == []
    # A build known to run clean needs no warning; the wheel's build is named.
    assert nc.choose("2.28.9", {}, "image", DGX_2289)["warnings"] == []
    (warning,) = nc.choose("2.28.9", {}, "image", PIP_2289)["warnings"]
    assert (
        "build a7f420a1" in warning and "its build is the pip wheel nvidia-nccl-cu13's" in warning
    )


def test_host_stands_when_chosen_explicitly_with_a_warning_in_the_range():
    result = nc.choose("2.28.9", hosts("2.28.9", "2.28.9"), "host")
    assert result["passed"] and result["library"] == "host"
    assert [w.split(":")[0] for w in result["warnings"]] == [
        "spark-1 loads its own NCCL 2.28.9",
        "spark-2 loads its own NCCL 2.28.9",
    ]
    mixed = nc.choose("2.28.9", hosts("2.30.7", "2.29.7"), "host")
    assert mixed["passed"] and mixed["warnings"][-1].startswith(
        "the nodes' NCCL versions or builds"
    )
    clean = nc.choose("2.28.9", hosts("2.28.9", "2.28.9"), "host", None, hosts(DGX_2289, DGX_2289))
    assert clean["passed"] and clean["warnings"] == []
    split = nc.choose(
        "2.28.9", hosts("2.28.9", "2.28.9"), "host", None, hosts(DGX_2289, OTHER_2289)
    )
    assert split["warnings"][-1].startswith("the nodes' NCCL versions or builds differ")


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
    ("image", "ibuild", "nodes", "nbuilds", "library"),
    [
        ("2.28.9 (the nvidia-nccl-cu13 wheel; torch has none)", None, hosts("2.30.7", "2.30.7"),
         None, "host"),
        ("2.28.9", PIP_2289, hosts("2.28.9", "2.28.9"), hosts(DGX_2289, DGX_2289), "host"),
        ("2.30.7", None, hosts("2.28.9", "2.28.9"), None, "image"),
        ("2.28.9", PIP_2289, hosts("2.28.9", "2.28.9"), hosts(PIP_2289, PIP_2289), None),
    ],
)  # fmt: skip
def test_pair_decides_as_choose_when_every_node_reports_the_same_image(
    image, ibuild, nodes, nbuilds, library
):
    result = nc.choose_pair(hosts(image, image), nodes, "auto", hosts(ibuild, ibuild), nbuilds)
    assert result["library"] == library and result["passed"] is (library is not None)
    assert result["pending"] is False


@pytest.mark.parametrize(
    ("images", "builds", "differ"),
    [
        (hosts("2.28.9", "2.30.7"), None, "(spark-1's 2.28.9, spark-2's 2.30.7)"),
        # The same version, different builds: two images, whatever their tags say.
        (hosts("2.28.9", "2.28.9"), hosts(PIP_2289, DGX_2289),
         "spark-2's 2.28.9 (190.0 MB, build c0db9360"),
    ],
)  # fmt: skip
def test_pair_auto_refuses_images_that_differ_between_nodes(images, builds, differ):
    result = nc.choose_pair(images, hosts("2.30.7", "2.30.7"), "auto", builds)
    assert not result["passed"] and result["library"] is None
    assert "the serving image's NCCL differs between the nodes" in result["message"]
    assert differ in result["message"]
    explicit = nc.choose_pair(images, hosts("2.30.7", "2.30.7"), "image", builds)
    assert explicit["passed"] and explicit["library"] == "image"
    assert explicit["warnings"][-1].startswith("the serving image's NCCL differs between the nodes")
