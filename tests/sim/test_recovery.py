"""The pair heals itself: faults made while a client asks for tokens, no playbook run after.

benchmarks/drills.py makes the faults; here the two the issue names for CI are drilled
after a cold start that sets the bound: a rank's container killed on the worker, the
worker node restarted (its dockerd and every container in it), a rank frozen while
every container runs (only the head's watchdog can see that one), and a power cut of both
nodes. Each must serve again, three good completions in a row, within a cold vLLM start
plus 60 s (a power cut: plus 120 s from the moment both nodes are back).
"""

from __future__ import annotations

import pytest
from conftest import drills

# Every fault here restarts the group (a node's restart, a power cut): `make test-drills`.
pytestmark = pytest.mark.drill


@pytest.fixture(scope="module")
def cold_start(deployed_pair, nodes):
    result = drills.drill("cold-start", nodes[0], nodes[1], timeout=600)
    assert result["recovered"], result
    print(f"\ncold start: {result['seconds']}s")
    return result["seconds"]


@pytest.mark.parametrize("fault", ["worker-rank", "worker-reboot", "rank-freeze", "power-cut"])
def test_the_pair_serves_again_by_itself(fault, cold_start, nodes):
    result = drills.drill(fault, nodes[0], nodes[1], timeout=cold_start + 300)
    print(f"\n{fault}: {result}")
    assert result["recovered"], result
    assert result["failed_requests"] > 0, f"{fault} interrupted nothing: {result}"
    bound = cold_start + 60
    if fault == "rank-freeze":
        # The watchdog first has to miss its probes (3 of them, 10 s apart, 10 s each on the
        # sim), and the frozen group gets 30 s to stop.
        bound += 3 * (10 + 10) + 30
    if fault == "power-cut":
        assert result["after_fault_done"] <= cold_start + 120, (result, cold_start)
        return
    assert result["seconds"] <= bound, (result, cold_start)
