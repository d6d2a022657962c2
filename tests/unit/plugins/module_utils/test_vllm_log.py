"""The grammar of a serving container's log line, shared by vllm_start and vllm_health."""

from __future__ import annotations

import pytest
from ansible_collections.dgx_spark.cluster.plugins.module_utils import vllm_log


def test_docker_time_refuses_other_text():
    with pytest.raises(ValueError, match="not a Docker log timestamp"):
        vllm_log.docker_time("12-01 10:00:01")


@pytest.mark.parametrize(
    ("raw", "source", "level", "message"),
    [
        # vLLM's logger inside its API server's prefix.
        ("(APIServer pid=1) ERROR 11-30 06:07:10 [file.py:12] bad value",
         "APIServer", "ERROR", "bad value"),
        # A rank on another node, forwarded by Ray with its colours around the prefix.
        ("\x1b[36m(RayWorkerProc pid=214, ip=172.30.241.12)\x1b[0m (Worker_TP1 pid=214) "
         "INFO 12-04 13:02:34 [default_loader.py:291] Loading weights took 0.01 seconds",
         "Worker_TP1@172.30.241.12", "INFO", "Loading weights took 0.01 seconds"),
        # Ray's own logger keeps the file it names; a nameless Ray prefix is a prefix too.
        ("(pid=425) 2026-12-01 04:27:01,479\tINFO worker.py:1691 -- Connecting",
         "", "INFO", "worker.py:1691 -- Connecting"),
        # uvicorn's.
        ("(APIServer pid=1) INFO:     Application startup complete.",
         "APIServer", "INFO", "Application startup complete."),
        # A traceback's line keeps its indentation; a line of no logger has no level.
        ('  File "/usr/lib/x.py", line 3, in f', "", "", '  File "/usr/lib/x.py", line 3, in f'),
        ("ValueError: max_model_len must be at least 1", "", "",
         "ValueError: max_model_len must be at least 1"),
        # Ray's deduplication suffix goes.
        ("(RayWorkerProc pid=94, ip=10.0.0.2) ERROR boom [repeated 2x across cluster]",
         "RayWorkerProc@10.0.0.2", "ERROR", "boom"),
    ],
)  # fmt: skip
def test_parse_takes_each_wrapper_off(raw, source, level, message):
    line = vllm_log.parse(raw)
    assert (line.stamp, line.source, line.level, line.message) == (None, source, level, message)


def test_parse_reads_dockers_timestamp_and_the_last_drawing_of_a_bar():
    line = vllm_log.parse(
        "2026-12-04T13:02:34.210147517Z shards:   0% Completed | 0/2\r"
        "shards:  50% Completed | 1/2\r\n"
    )
    assert line.stamp == pytest.approx(1796389354.210147)
    assert line.message == "shards:  50% Completed | 1/2"
