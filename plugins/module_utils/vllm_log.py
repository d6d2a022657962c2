# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The grammar of a serving container's log line: what wraps vLLM's and Ray's own message.

Pure and standard library only: ``vllm_start`` (a start's progress) and ``vllm_health`` (why a
start failed) read lines through it, in the modules and in the head's watchdog
(``roles/vllm_serve/files/dgx_spark_watchdog.py``, beside which
``roles/vllm_serve/tasks/watchdog.yml`` installs this file).

A line is, each part optional and in this order: Docker's timestamp (``docker logs
--timestamps``), colour codes, the prefixes of the processes that forwarded it (vLLM's
``(APIServer pid=1)``, Ray's ``(RayWorkerWrapper pid=312, ip=10.0.0.2)`` for an actor's line,
the innermost the process that wrote it), a logger's prefix with the level (vLLM's, uvicorn's
or Ray's), the message, and Ray's ``[repeated Nx across cluster]`` for a line several actors
wrote.
"""

from __future__ import annotations

import calendar
import re
import time
from typing import NamedTuple

# ``docker logs --timestamps``: RFC 3339 with nanoseconds, then one space.
DOCKER_TS = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?Z ")
# Ray colours the prefix of the lines it forwards from an actor: "\x1b[36m(RayWorkerProc
# pid=214, ip=172.30.241.12)\x1b[0m (Worker_TP1 pid=214) INFO ...".
ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "(RayWorkerWrapper pid=312, ip=10.0.0.2) ", "(APIServer pid=1) ", "(pid=214) ".
SOURCE = re.compile(
    r"^\((?:(?P<who>[A-Za-z][\w-]*) )?pid=(?P<pid>\d+)(?:, ip=(?P<ip>[^,)\s]+)[^)]*)?\)\s*"
)
# The loggers' prefixes, each naming the level:
# Ray's: "2026-12-01 04:27:01,479\tINFO worker.py:1691 -- Connecting ..." (the file stays);
# vLLM's: "INFO 11-30 06:07:38 [file.py:347] " (the level or the date and file alone too);
# uvicorn's: "INFO:     ".
LEVEL = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(?P<ray>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+"
    r"|(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)"
    r"(?::|(?: \d\d-\d\d [\d:.]+ \[[^\]]*\])?(?=\s|$))\s*"
    r"|\d\d-\d\d [\d:.]+ \[[^\]]*\]\s*)"
)
REPEATED = re.compile(r"\s*\[repeated \d+x across cluster\]\s*$")


class Line(NamedTuple):
    """One log line taken apart: ``message`` keeps its indentation (a traceback's)."""

    stamp: float | None
    source: str
    level: str
    message: str


def docker_time(stamp: str) -> float:
    """Seconds since the epoch of a Docker log timestamp (``2026-11-30T06:07:38.123Z``)."""
    match = DOCKER_TS.match(stamp.strip() + " ")
    if not match:
        raise ValueError(f"not a Docker log timestamp: {stamp!r}")
    whole = calendar.timegm(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))
    return whole + float(match.group(2) or 0.0)


def parse(raw: str) -> Line:
    """Docker's timestamp (or None), the process that wrote the line, the level ('' when no
    logger named one) and the message of one log line.

    The process is a Ray actor's with its node (``RayWorkerWrapper@10.0.0.2``: only Ray's outer
    prefix names the node of a rank on another node, and it is kept), vLLM's (``EngineCore``)
    or '' for lines without a prefix (tqdm bars of a single process).
    """
    line = raw.rstrip("\r\n")
    stamp = None
    match = DOCKER_TS.match(line)
    if match:
        stamp = docker_time(match.group(0))
        line = line[match.end() :]
    # tqdm redraws with carriage returns: the last drawing is what the line says.
    line = ANSI.sub("", line.rsplit("\r", 1)[-1]).rstrip()
    who, ip = "", ""
    match = SOURCE.match(line.lstrip())
    while match:
        who, ip = match.group("who") or "", match.group("ip") or ip
        line = line.lstrip()[match.end() :]
        match = SOURCE.match(line)
    level = ""
    logger = LEVEL.match(line.lstrip())
    if logger and logger.end():
        level = logger.group("ray") or logger.group("level") or ""
        line = line.lstrip()[logger.end() :]
    return Line(stamp, f"{who}@{ip}" if ip else who, level, REPEATED.sub("", line))
