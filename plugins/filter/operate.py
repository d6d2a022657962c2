# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""Filters the operate role uses; thin wrappers over plugins/module_utils/pair_status,
ray_status, bench_results and operate_settings (documented in the sidecar YAML files next to
this one)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.dgx_spark.cluster.plugins.module_utils import (
    bench_results,
    operate_settings,
    pair_status,
    ray_status,
    vllm_metrics,
)
from ansible_collections.dgx_spark.cluster.plugins.plugin_utils.role_filter import role_filter


def operate_status_report(nodes, head, endpoint, ray_text, settings):
    """The status report (dict) of the pair from every node's read-only answers."""
    settings = dict(settings)
    condensed = {}
    for name, node in dict(nodes).items():
        if not node:
            condensed[str(name)] = None
            continue
        condensed[str(name)] = pair_status.node_status(
            node.get("serving"),
            node.get("ray"),
            node.get("image"),
            node.get("facts"),
            str(settings.get("checked_at") or ""),
            list(settings.get("disk_paths") or []),
        )
    if ray_text is None:
        ray = {"parsed": False, "error": "not asked (the Ray container is not running)"}
    else:
        ray = ray_status.parse(str(ray_text))
        if not ray["parsed"]:
            ray["error"] = str(ray_text).strip().splitlines()[-1:] or "no output"
    return pair_status.cluster_report(condensed, str(head), dict(endpoint or {}), ray, settings)


def operate_status_lines(report):
    """The report as printable lines: the cluster table, one line per node, the findings."""
    return pair_status.render(dict(report))


def operate_bench_summary(runs):
    """Rows, consistency errors, CSV text and a console table from the runs' JSON results."""
    rows, errors = [], []
    for run in runs:
        try:
            row = bench_results.summary_row(
                dict(run["result"]), run.get("input_len"), run.get("output_len")
            )
        except (bench_results.BenchResultError, KeyError, TypeError) as exc:
            raise AnsibleFilterError(f"operate_bench_summary: {run.get('file')}: {exc}") from exc
        rows.append(row)
        label = f"concurrency {row['concurrency']}, {row['input_len']}/{row['output_len']} tokens"
        errors += [f"{label}: {e}" for e in bench_results.check_row(row)]
    return {
        "rows": rows,
        "errors": errors,
        "csv": bench_results.to_csv(rows),
        "table": bench_results.table(rows) if rows else [],
    }


def operate_speculative(before, after):
    """Speculative decoding's acceptance between two scrapes of /metrics (the ``metrics`` of
    vllm_endpoint_info before and after the sweep); None where it is off."""
    return vllm_metrics.speculative(dict(before or {}), dict(after or {}))


def operate_container_logs(results, loop_var):
    """``docker logs`` results of a loop as [{name: <container>.log, content}], streams merged."""
    files = []
    for result in results:
        name = str(result.get(loop_var) or result.get("item") or "container")
        content = pair_status.merge_logs(result.get("stdout", ""), result.get("stderr", ""))
        if result.get("rc", 0) != 0 and not content:
            content = f"docker logs failed: {result.get('msg') or result.get('rc')}\n"
        files.append({"name": f"{name}.log", "content": content})
    return files


def operate_mask_secrets(value, secrets=None):
    """``value`` with secret-named environment values and every known secret masked."""
    return pair_status.mask_secrets(value, [str(s) for s in (secrets or []) if s])


def operate_setting_errors(settings):
    """What the operate role's settings refuse, as messages naming the variables."""
    return operate_settings.setting_errors(dict(settings))


# The operations of the one filter this role uses, dgx_spark.cluster.operate:
# ``value | dgx_spark.cluster.operate('<operation>', ...)``.
OPERATIONS = {
    "status_report": operate_status_report,
    "status_lines": operate_status_lines,
    "bench_summary": operate_bench_summary,
    "speculative": operate_speculative,
    "container_logs": operate_container_logs,
    "mask_secrets": operate_mask_secrets,
    "setting_errors": operate_setting_errors,
}


class FilterModule:
    def filters(self):
        return {"operate": role_filter("operate", OPERATIONS)}
