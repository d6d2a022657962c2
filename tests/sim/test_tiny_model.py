"""Two builds of the sim's tiny model give the same bytes, file for file.

sim-up skips making the model when its inputs' digest (sim_images.tiny_model_inputs: the
generator, its template and conversations, the donor image) matches the stamp: that is sound
only if the same inputs always give the same checkpoint. This module needs the donor image
(`make sim-up` builds it), not the pair; each build takes about ten seconds of one core.
The test's build is given other thread settings than sim-up's (the generator pins its own)
and is compared with the copy sim-up made from the same inputs; where that copy is missing or
from other inputs, a second build with the default settings stands in for it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import sim_images


def build(out: Path, *env: str) -> dict[str, bytes]:
    out.parent.mkdir(parents=True)
    proc = subprocess.run(
        sim_images.tiny_model_command(out, env), capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {path.name: path.read_bytes() for path in sorted(out.iterdir())}


@pytest.fixture(scope="module")
def donor():
    if not sim_images.image_id(sim_images.DONOR_IMAGE):
        pytest.fail(f"no {sim_images.DONOR_IMAGE} image: run `make sim-up` first")
    return sim_images.DONOR_IMAGE


def test_two_builds_of_the_tiny_model_give_the_same_bytes(donor, tmp_path):
    built = build(tmp_path / "one" / "tiny", "OMP_NUM_THREADS=2", "MKL_NUM_THREADS=2")
    assert sorted(built) == [
        "config.json", "generation_config.json", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.json",
        "tokenizer_config.json",
    ]  # fmt: skip
    # The other build: the copy the pair serves, when sim-up made it from these same inputs.
    stamp = sim_images.TINY_MODEL / ".inputs"
    if stamp.is_file() and stamp.read_text() == sim_images.tiny_model_inputs():
        other, where = {p.name: p.read_bytes() for p in sim_images.TINY_MODEL.iterdir()}, "sim-up"
        other.pop(".inputs")
    else:
        other, where = build(tmp_path / "two" / "tiny"), "a second build"
    differ = sorted(set(other) ^ set(built) | {n for n in built if other.get(n) != built[n]})
    assert not differ, f"the test's build of the tiny model and {where}'s differ in {differ}"
