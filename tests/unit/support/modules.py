"""Run a module's main() in-process, the way Ansible would, and read its JSON answer."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_module(module, args: dict, capsys, check_mode: bool = False) -> tuple[int, dict]:
    """Return (exit code, result) of ``module.main()`` given ``args``."""
    if check_mode:
        args = {**args, "_ansible_check_mode": True}
    with patch_module_args(args), pytest.raises(SystemExit) as exit_:
        module.main()
    return exit_.value.code, json.loads(capsys.readouterr().out)
