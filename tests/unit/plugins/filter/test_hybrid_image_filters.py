"""plugins/filter/hybrid_image.py's preflight: the donor is required only where it is needed."""

from __future__ import annotations

from ansible_collections.dgx_spark.cluster.plugins.filter import hybrid_image as hi

BASE, DONOR = "vllm-node:latest", "hellohal2064/vllm-qwen3.5-gb10:latest"
BASE_ID = "sha256:" + "a" * 64
INPUTS = {
    "hybrid_image_base": BASE,
    "hybrid_image_base_id": "",
    "hybrid_image_donor": DONOR,
    "hybrid_image_donor_id": "",
}


def preflight(found, donor_needed):
    return hi.hybrid_image_preflight(
        found, "spark-1", "overlay", INPUTS, "2.60.0", "", donor_needed
    )


def test_a_base_that_serves_as_it_is_needs_no_donor_on_the_node():
    checked = preflight({BASE: BASE_ID}, donor_needed=False)
    assert checked["errors"] == []
    # The cluster runs the base's own Ray, not the overlay's.
    assert checked["ray_source"] == "the base (hybrid_image_base)"


def test_the_donor_is_required_where_the_base_lacks_an_architecture():
    errors = preflight({BASE: BASE_ID}, donor_needed=True)["errors"]
    assert len(errors) == 1
    assert errors[0].startswith(f"spark-1: hybrid_image_donor ({DONOR}) is not on this node")


def test_the_base_is_always_required():
    errors = preflight({}, donor_needed=False)["errors"]
    assert [e.split(" (", 1)[0] for e in errors] == ["spark-1: hybrid_image_base"]


def test_a_malformed_donor_pin_is_refused_even_where_the_donor_is_not_needed():
    inputs = {**INPUTS, "hybrid_image_donor_id": "latest"}
    checked = hi.hybrid_image_preflight(
        {BASE: BASE_ID}, "spark-1", "overlay", inputs, "2.60.0", "", False
    )
    assert [e.split(" (", 1)[0] for e in checked["errors"]] == ["spark-1: hybrid_image_donor_id"]
