# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""The status report of a serving pair, from what each node's read-only tasks returned.

Pure functions behind the operate role's filters: ``node_status`` condenses one node's
``docker inspect`` results, image and facts; ``cluster_report`` joins the nodes with the
head's endpoint and Ray answers and decides healthy or not; ``render`` prints it as two
tables; ``mask_secrets`` hides secrets in inspect output and logs.
"""

from __future__ import annotations

import re
from datetime import datetime

from ansible_collections.dgx_spark.cluster.plugins.module_utils.elf_notes import short_build
from ansible_collections.dgx_spark.cluster.plugins.module_utils.image_report import (
    with_nccl_build,
)

# Names of values that are secrets; a name ending in _PATH/_FILE/_DIR holds where one is.
_SECRET_NAME = re.compile(
    r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)(?!.*_(PATH|FILE|DIR)$)", re.IGNORECASE
)
MASK = "********"


def _parse_time(value: str | None) -> datetime | None:
    """Docker's RFC 3339 time with nanoseconds, or None for Docker's zero time."""
    if not value or value.startswith("0001-01-01"):
        return None
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$", value)
    if not match:
        return None
    base, fraction, zone = match.groups()
    micro = (fraction or "0")[:6].ljust(6, "0")
    zone = "+00:00" if zone == "Z" else zone
    return datetime.fromisoformat(f"{base}.{micro}{zone}")


LOAD_FORMAT_LABEL = "dgx_spark.cluster.load_format"


def container_status(inspect: dict | None, now: str) -> dict:
    """State, health, uptime and restarts of one container from its ``docker inspect``."""
    if not inspect:
        return {"exists": False, "state": "absent", "running": False, "health": None,
                "uptime_s": None, "restarts": None, "image_id": None}  # fmt: skip
    state = inspect.get("State") or {}
    health = (state.get("Health") or {}).get("Status")
    started = _parse_time(state.get("StartedAt"))
    current = _parse_time(now)
    uptime = None
    if state.get("Running") and started and current:
        uptime = max(0, int((current - started).total_seconds()))
    return {
        "exists": True,
        "name": (inspect.get("Name") or "").lstrip("/"),
        "state": state.get("Status") or ("running" if state.get("Running") else "unknown"),
        "running": bool(state.get("Running")),
        "health": health,
        "uptime_s": uptime,
        "restarts": inspect.get("RestartCount", 0),
        "exit_code": None if state.get("Running") else state.get("ExitCode"),
        "image_id": inspect.get("Image"),
        # The serving role's choice of weight loader and its reason (a label of the ranks).
        "load_format": ((inspect.get("Config") or {}).get("Labels") or {}).get(LOAD_FORMAT_LABEL),
    }


def mount_of(path: str, mounts: list[dict]) -> dict | None:
    """The mount (from Ansible's ``ansible_mounts``) that holds ``path``: longest prefix."""
    best = None
    for mount in mounts or []:
        point = mount.get("mount", "")
        inside = path == point or path.startswith(point.rstrip("/") + "/") or point == "/"
        if inside and (best is None or len(point) > len(best["mount"])):
            best = mount
    return best


def node_status(
    serving: dict | None,
    ray: dict | None,
    image: dict | None,
    facts: dict | None,
    now: str,
    disk_paths: list[str] | None = None,
) -> dict:
    """One node's line: its two containers, the serving image's ID, memory and disk."""
    facts = facts or {}
    memory = facts.get("ansible_memory_mb") or {}
    total_mb = facts.get("ansible_memtotal_mb") or (memory.get("real") or {}).get("total")
    available_mb = (memory.get("nocache") or {}).get("free")
    mem = None
    if total_mb:
        mem = {
            "total_mb": int(total_mb),
            "available_mb": None if available_mb is None else int(available_mb),
            "used_pct": None
            if available_mb is None
            else round(100.0 * (total_mb - available_mb) / total_mb, 1),
        }
    disks = []
    for path in disk_paths or []:
        mount = mount_of(path, facts.get("ansible_mounts") or [])
        if not mount or not mount.get("size_total"):
            continue
        total = mount["size_total"]
        free = mount.get("size_available", 0)
        disks.append({
            "path": path,
            "mount": mount["mount"],
            "total_gb": round(total / 2**30, 1),
            "free_gb": round(free / 2**30, 1),
            "used_pct": round(100.0 * (total - free) / total, 1),
        })  # fmt: skip
    return {
        "serving": container_status(serving, now),
        "ray": container_status(ray, now),
        "image_id": (image or {}).get("Id"),
        "image_tags": sorted((image or {}).get("RepoTags") or []),
        "memory": mem,
        "disks": disks,
    }


_NCCL_FILE_VERSION = re.compile(r"libnccl\.so\.(\d+\.\d+\.\d+)")


def rank_nccl(
    loaded: list[str] | None,
    report: dict | None,
    host_library: str | None = None,
    in_container: str = "",
    builds: dict | None = None,
) -> dict:
    """Which NCCL a node's ranks loaded, from the libnccl paths mapped into the Ray container's
    processes (``/proc/<pid>/maps``).

    ``report``: the image report of the image the ranks run (hybrid_image's, None where there
    is none); ``host_library``: the real file of the node's libnccl (the symbolic link
    resolved); ``in_container``: where the serving roles mount it (spark_nccl_in_container);
    ``builds``: path -> the build of that file as read in the Ray container
    (``elf_notes.library_build``).
    Returns ``{library, version, paths, build}``: ``library`` is ``host`` (the node's, mounted),
    ``image`` (one of the image's files), ``other`` or None when no rank holds NCCL; ``build``
    the build of that file (None where it was not read).
    """
    paths = sorted({str(p).strip() for p in loaded or [] if "libnccl" in str(p)})
    if not paths:
        return {"library": None, "version": None, "paths": [], "build": None}
    image_files = set(((report or {}).get("files") or {}).get("libnccl") or [])
    image_dirs = {f.rsplit("/", 1)[0] for f in image_files}

    def found(library, version, path):
        build = (builds or {}).get(path)
        known = build if isinstance(build, dict) and short_build(build) else None
        return {"library": library, "version": version, "paths": paths, "build": known}

    for path in paths:
        if in_container and path == in_container:
            match = _NCCL_FILE_VERSION.search(str(host_library or ""))
            return found("host", match.group(1) if match else None, path)
    for path in paths:
        if path in image_files or path.rsplit("/", 1)[0] in image_dirs:
            return found("image", ((report or {}).get("nccl") or {}).get("version"), path)
    match = next(filter(None, (_NCCL_FILE_VERSION.search(p) for p in paths)), None)
    path = next((p for p in paths if _NCCL_FILE_VERSION.search(p)), paths[0])
    return found("other", match.group(1) if match else None, path)


def _nccl_text(nccl: dict | None) -> str:
    nccl = nccl or {}
    if not nccl.get("paths"):
        return "no libnccl (no rank holds NCCL: a CPU build, or no rank running)"
    whose = {"host": "the node's", "image": "the image's"}.get(nccl.get("library"), "a")
    build = short_build(nccl.get("build"))
    return (
        f"{whose} NCCL {nccl.get('version') or '(version unknown)'}"
        + (f", build {build}" if build else "")
        + f" ({', '.join(nccl['paths'])})"
    )


def _short(image_id: str | None) -> str:
    if not image_id:
        return "-"
    return image_id.split(":", 1)[-1][:12]


def cluster_report(nodes: dict, head: str, endpoint: dict | None, ray: dict | None,
                   settings: dict) -> dict:  # fmt: skip
    """The whole report and its verdict.

    ``nodes`` maps every inventory node to its ``node_status`` (None where the node gave
    nothing: unreachable). ``settings``: backend, image, served_model_name, url,
    expected_gpus, expect_ray, disk_warn_pct, checked_at.
    """
    problems: list[str] = []
    warnings: list[str] = []
    backend = settings.get("backend", "ray")
    image = settings.get("image", "")
    report_nodes = {}
    for name, node in nodes.items():
        role = "head" if name == head else "worker"
        if node is None:
            problems.append(f"{name}: no answer (unreachable or its tasks failed)")
            report_nodes[name] = {"role": role, "reachable": False}
            continue
        serves_here = backend == "multinode" or name == head
        serving = node["serving"]
        if serves_here and not serving.get("running"):
            serving_name = serving.get("name") or settings.get("serving_name", "")
            problems.append(f"{name}: serving container {serving_name} is {serving['state']}")
        if serving.get("health") == "unhealthy":
            problems.append(f"{name}: serving container reports unhealthy")
        ray_container = node["ray"]
        if settings.get("expect_ray", True) and not ray_container.get("running"):
            ray_name = ray_container.get("name") or settings.get("ray_name", "")
            problems.append(f"{name}: Ray container {ray_name} is {ray_container['state']}")
        if not node.get("image_id"):
            problems.append(f"{name}: no image {image}")
        # The ranks live in these containers (the Ray executor's actors in the Ray ones): one on
        # another image than the alias names puts the group on two vLLM builds.
        for part in ("serving", "ray"):
            info = node[part]
            if (
                info.get("running")
                and node.get("image_id")
                and info["image_id"] != node["image_id"]
            ):
                problems.append(
                    f"{name}: the {part} container runs {_short(info['image_id'])}, but {image} "
                    f"is {_short(node['image_id'])}: the ranks are not on one image; run "
                    "deploy.yml (its serving stage moves every rank together)"
                )
        for disk in node.get("disks", []):
            if disk["used_pct"] >= settings.get("disk_warn_pct", 90):
                warnings.append(f"{name}: {disk['mount']} is {disk['used_pct']}% full")
        report_nodes[name] = {"role": role, "reachable": True, "serves": serves_here, **node}
        # What the ranks' image holds (hybrid_image's report, kept on the node) and the NCCL
        # the ranks loaded; absent where the caller did not read them.
        rank = (settings.get("ranks") or {}).get(name)
        if isinstance(rank, dict):
            image_report = (
                rank.get("image_report") if isinstance(rank.get("image_report"), dict) else None
            )
            report_nodes[name]["image_report"] = image_report
            nccl = rank_nccl(
                rank.get("nccl_loaded"),
                image_report,
                rank.get("nccl_host_library"),
                str(settings.get("nccl_in_container") or ""),
                rank.get("nccl_builds") if isinstance(rank.get("nccl_builds"), dict) else None,
            )
            report_nodes[name]["nccl"] = nccl
            # The ranks map the image's own file: its report names that build too.
            if nccl["library"] == "image":
                report_nodes[name]["image_report"] = with_nccl_build(image_report, nccl["build"])
            if image_report is None and node.get("image_id"):
                warnings.append(
                    f"{name}: no image report for {_short(node.get('image_id'))} (what the image "
                    "holds is unknown): run playbooks/images.yml, which writes it"
                )

    reachable = {n: v for n, v in report_nodes.items() if v.get("reachable")}
    ids = {v.get("image_id") for v in reachable.values()}
    images_match = len(ids) == 1 and None not in ids
    # Nodes that each build the image (hybrid_image_mode each_node) get different IDs from
    # the same inputs; the image's other tags (hybrid_image's input digest) say whether the
    # builds are the same.
    builds = {tuple(t for t in v.get("image_tags", []) if t != image) for v in reachable.values()}
    builds_match = images_match or (len(builds) == 1 and () not in builds)
    if None not in ids and not builds_match:
        problems.append(
            f"{image} differs across nodes: "
            + ", ".join(
                f"{n} {_short(v.get('image_id'))} {' '.join(v.get('image_tags', []))}"
                for n, v in reachable.items()
            )
        )

    endpoint = endpoint or {}
    health = endpoint.get("health") or {}
    completion = endpoint.get("completion") or {}
    if not endpoint:
        problems.append(f"{head}: the endpoint was not asked (the head gave no answer)")
    else:
        if not health.get("ok"):
            problems.append(f"endpoint /health: {health.get('error') or health.get('status')}")
        served = endpoint.get("models") or []
        wanted = settings.get("served_model_name")
        if health.get("ok") and wanted and wanted not in served:
            problems.append(f"endpoint serves {served or 'no model'}, not {wanted}")
        if health.get("ok") and not completion.get("ok"):
            problems.append(f"endpoint completion failed: {completion.get('error')}")

    ray = ray or {}
    if settings.get("expect_ray", True):
        if not ray.get("parsed"):
            problems.append(f"ray status on {head}: {ray.get('error') or 'no answer'}")
        else:
            if ray["alive_nodes"] < len(nodes):
                problems.append(f"Ray: {ray['alive_nodes']} of {len(nodes)} nodes alive")
            expected_gpus = float(settings.get("expected_gpus") or 0)
            if ray["gpus_total"] < expected_gpus:
                problems.append(f"Ray: {ray['gpus_total']:g} GPUs, {expected_gpus:g} needed")

    # Each node's watchdog (ray backend: the head's; multinode: every node's) writes its
    # state; one that gave up is a problem: its rank did not come back by itself.
    watchdogs = {node: state for node, state in (settings.get("watchdogs") or {}).items()
                 if isinstance(state, dict) and state.get("state")}  # fmt: skip
    for node, state in watchdogs.items():
        if state["state"] == "gave-up":
            reason = state.get("reason") or "no reason given"
            problems.append(f"watchdog on {node} gave up: {reason}")

    cluster = {
        "backend": backend,
        "watchdogs": watchdogs,
        "head": head,
        "url": settings.get("url"),
        "profile": settings.get("profile"),
        "model": endpoint.get("model"),
        "health": health,
        "completion": completion,
        "metrics": endpoint.get("metrics"),
        "ray": ray,
        "image": image,
        "load_format": ((report_nodes.get(head) or {}).get("serving") or {}).get("load_format"),
        "image_id": next(iter(ids)) if images_match else None,
        "image_ids_match": images_match,
        "image_builds_match": builds_match,
        "image_build": ", ".join(next(iter(builds))) if builds_match and len(builds) == 1 else None,
    }
    return {
        "healthy": not problems,
        "checked_at": settings.get("checked_at"),
        "problems": problems,
        "warnings": warnings,
        "cluster": cluster,
        "nodes": report_nodes,
    }


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _container_cell(info: dict, expected: bool) -> str:
    if not info.get("exists"):
        return "absent" if expected else "-"
    text = info["state"]
    if info.get("health"):
        text += f" ({info['health']})"
    if info.get("running"):
        text += f" up {_duration(info.get('uptime_s'))}"
    elif info.get("exit_code") is not None:
        text += f" rc={info['exit_code']}"
    return text + f" r{info.get('restarts', 0)}"


def _number(value, unit: str = "", digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        value = round(value, digits) if digits else int(round(value))
    return f"{value}{unit}"


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _watchdog_text(watchdogs: dict) -> str:
    """'-' without a watchdog; else each node's state, restarts and reason."""
    texts = []
    for node, state in watchdogs.items():
        text = f"{node} {state['state']}, {state.get('restarts', 0)} restarts in its window"
        texts.append(f"{text}: {state['reason']}" if state.get("reason") else text)
    return "; ".join(texts) or "-"


def render(report: dict) -> list[str]:
    """The report as lines: one table for the cluster, one line per node, then findings."""
    cluster = report["cluster"]
    health = cluster.get("health") or {}
    completion = cluster.get("completion") or {}
    metrics = cluster.get("metrics") or {}
    model = cluster.get("model") or {}
    ray = cluster.get("ray") or {}
    verdict = "HEALTHY" if report["healthy"] else f"UNHEALTHY ({len(report['problems'])} problems)"
    if ray.get("parsed"):
        ray_text = (f"{ray['alive_nodes']} nodes alive ({ray.get('pending_nodes', 0)} pending), "
                    f"GPUs {ray['gpus_used']:g}/{ray['gpus_total']:g} in use")  # fmt: skip
    else:
        ray_text = ray.get("error") or "-"
    if cluster.get("image_ids_match"):
        images = f"ID {_short(cluster.get('image_id'))} on every node (IDs match)"
    elif cluster.get("image_builds_match"):
        images = (
            f"IDs differ (each node built its own), same build inputs: {cluster.get('image_build')}"
        )
    else:
        images = "MISMATCH or missing (see the nodes)"
    cluster_rows = [
        ["status", verdict],
        ["checked at", str(report.get("checked_at") or "-")],
        ["backend", f"{cluster['backend']} (head {cluster['head']})"],
        ["endpoint", f"{cluster.get('url') or '-'}  health " + (
            "ok" if health.get("ok") else str(health.get("error") or health.get("status")))],
        ["profile", str(cluster.get("profile") or "-")],
        ["model", f"{model.get('id') or '-'}  ({model.get('root') or '-'}, "
                  f"max_model_len {model.get('max_model_len') or '-'})"],
        ["1-token completion", _number(completion.get("latency_ms"), " ms")
         if completion.get("ok") else f"failed: {completion.get('error') or '-'}"
         if health.get("ok") else "- (endpoint down)"],
        ["requests running/waiting", f"{_number(metrics.get('running'))} / "
                                     f"{_number(metrics.get('waiting'))}"],
        ["KV-cache usage", _number(metrics.get("kv_cache_usage_pct"), " %")],
        ["throughput prompt/gen", f"{_number(metrics.get('prompt_tokens_per_s'))} / "
                                  f"{_number(metrics.get('generation_tokens_per_s'))} tok/s "
                                  f"(over {_number(metrics.get('interval_s'), ' s')})"],
        ["tokens since start", f"prompt {_number(metrics.get('prompt_tokens'), digits=0)}, "
                               f"generated {_number(metrics.get('generation_tokens'), digits=0)}"],
        ["requests since start", f"{_number(metrics.get('requests_finished'))} finished, "
                                 f"{_number(metrics.get('requests_aborted'))} aborted, "
                                 f"{_number(metrics.get('requests_errored'))} errored"],
        ["Ray", ray_text],
        ["watchdog", _watchdog_text(cluster.get("watchdogs") or {})],
        ["weight loader", cluster.get("load_format") or "-"],
        [cluster.get("image") or "image", images],
    ]  # fmt: skip
    lines = ["cluster"] + ["  " + line for line in _table(cluster_rows)]
    node_rows = [["node", "role", "serving", "ray", "image", "memory used", "disk used"]]
    for name, node in report["nodes"].items():
        if not node.get("reachable"):
            node_rows.append([name, node["role"], "UNREACHABLE", "-", "-", "-", "-"])
            continue
        mem = node.get("memory") or {}
        mem_text = (
            f"{_number(mem.get('used_pct'), '%')} of {mem['total_mb'] / 1024:.1f} GiB"
            if mem
            else "-"
        )
        disk_text = ", ".join(
            f"{d['mount']} {d['used_pct']}% of {d['total_gb']} GiB" for d in node.get("disks", [])
        )
        node_rows.append([
            name,
            node["role"],
            _container_cell(node["serving"], node.get("serves", True)),
            _container_cell(node["ray"], True),
            _short(node.get("image_id")),
            mem_text,
            disk_text or "-",
        ])  # fmt: skip
    lines += ["nodes"] + ["  " + line for line in _table(node_rows)]
    for name, node in report["nodes"].items():
        if "image_report" in node:
            held = (node.get("image_report") or {}).get("summary") or "no image report"
            lines.append(f"  {name} image {_short(node.get('image_id'))}: {held}")
        if "nccl" in node:
            lines.append(f"  {name} ranks load {_nccl_text(node.get('nccl'))}")
    lines += [f"PROBLEM: {p}" for p in report["problems"]]
    lines += [f"warning: {w}" for w in report["warnings"]]
    return lines


def merge_logs(stdout: str, stderr: str) -> str:
    """``docker logs --timestamps`` stdout and stderr as one log, in time order.

    Lines that continue a multi-line record (no timestamp of their own) stay with the line
    before them; Docker's timestamps sort as text within a stream and across both.
    """
    records = []
    for stream in (stdout or "", stderr or ""):
        for line in stream.splitlines():
            if _DOCKER_TIME.match(line) or not records:
                records.append([_sort_key(line), line])
            else:
                records[-1][1] += "\n" + line
    records.sort(key=lambda record: record[0])
    return "".join(record[1] + "\n" for record in records)


_DOCKER_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z ")


def _sort_key(line: str) -> str:
    match = _DOCKER_TIME.match(line)
    if not match:
        return ""
    # Docker trims trailing zeros of the nanoseconds: pad them back so text order is time order.
    return f"{match.group(1)}.{(match.group(2) or '').ljust(9, '0')}"


def mask_secrets(value, secrets: list[str] | None = None):
    """``value`` with secret-named environment entries and every known secret hidden.

    Environment lists (``NAME=value``) and dicts whose key names a key, token, secret or
    password get their value replaced; any occurrence of a string in ``secrets`` anywhere
    (logs, command lines, labels) is replaced too.
    """
    known = sorted({s for s in (secrets or []) if s and len(s) >= 4}, key=len, reverse=True)

    def scrub(text: str) -> str:
        for secret in known:
            text = text.replace(secret, MASK)
        return text

    def walk(item, key: str = ""):
        if isinstance(item, dict):
            return {k: (MASK if _SECRET_NAME.search(str(k)) and isinstance(v, str) and v
                        else walk(v, str(k))) for k, v in item.items()}  # fmt: skip
        if isinstance(item, list):
            return [walk(v, key) for v in item]
        if isinstance(item, str):
            if "=" in item and key in ("Env", "env"):
                name, val = item.split("=", 1)
                if _SECRET_NAME.search(name) and val:
                    return f"{name}={MASK}"
            return scrub(item)
        return item

    return walk(value)
