"""plugins/module_utils/operate_settings.py: the operate role's settings, refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ansible_collections.dgx_spark.cluster.plugins.module_utils import operate_settings

ROOT = Path(__file__).resolve().parents[4]
DEFAULTS = yaml.safe_load((ROOT / "roles/operate/defaults/main.yml").read_text())
# The defaults that are templates, as they render on the sim (spark_hardware false).
SIM = {
    **DEFAULTS,
    "operate_benchmark_concurrency": [1, 2, 4],
    "operate_benchmark_lengths": [{"input": 96, "output": 24}],
    "operate_benchmark_prompts_per_slot": 4,
    "operate_benchmark_min_prompts": 8,
}


def test_the_defaults_pass():
    assert operate_settings.setting_errors(SIM) == []


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"operate_status_timeout": 0},
         "operate_status_timeout is 0; allowed: whole seconds 1-600"),
        ({"operate_status_disk_warn_pct": 101},
         "operate_status_disk_warn_pct is 101; allowed: whole percent 1-100"),
        ({"operate_status_metrics_interval": 0},
         "operate_status_metrics_interval is 0; allowed: seconds 0.1-60.0"),
        ({"operate_benchmark_run_timeout": "soon"},
         "operate_benchmark_run_timeout is 'soon'; allowed: whole seconds 60-86400"),
        ({"operate_benchmark_seed": -1},
         "operate_benchmark_seed is -1; allowed: whole numbers 0-4294967295"),
        ({"operate_logs_lines": True},
         "operate_logs_lines is True; allowed: whole lines 1-1000000"),
        ({"operate_status_disk_paths": ["var/lib/docker"]},
         "operate_status_disk_paths is ['var/lib/docker']; allowed: a list of one or more "
         "absolute paths"),
        ({"operate_benchmark_concurrency": []},
         "operate_benchmark_concurrency is []; allowed: a list of one or more whole numbers >= 1"),
        ({"operate_benchmark_concurrency": [1, 0]},
         "operate_benchmark_concurrency is [1, 0]; allowed: a list of one or more whole "
         "numbers >= 1"),
        ({"operate_benchmark_lengths": [{"input": 96}]},
         "operate_benchmark_lengths is [{'input': 96}]; allowed: a list of one or more "
         "{input: N, output: M} token counts, each >= 1"),
    ],
)  # fmt: skip
def test_a_bad_setting_is_refused_by_name(override, expected):
    assert operate_settings.setting_errors({**SIM, **override}) == [expected]


def test_strings_from_extra_vars_count_as_their_numbers():
    assert operate_settings.setting_errors({**SIM, "operate_status_timeout": "30"}) == []
