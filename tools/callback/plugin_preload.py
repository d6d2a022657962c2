"""Imports the collection's controller-side plugins once, in ansible-playbook's own process.

ansible-playbook forks a worker for every task on every host, and a worker that templates a
filter or a lookup of this collection, or runs its action plugin, imports that plugin's file and
the module_utils it imports, compiled from source (the collection loader keeps no bytecode),
and loses them when it exits. Imported here first, they are in every forked worker already (the
plugin loader takes a module it finds in sys.modules). On the simulated pair a full run of
deploy.yml (-e deploy_full=true, nothing to change) took 72.8 s without it and 61 s with it, its
controller CPU 46 s against 32 s; py-spy had put a fifth of its samples in those imports.

Loaded by the checkout's ansible.cfg (``callback_plugins``) alone, as module_zip_cache is: the
collection does not ship it, and without it a run imports the filters as ansible-core does.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: plugin_preload
type: aggregate
short_description: import the collection's plugins before ansible-playbook forks
description:
  - Imports the checkout collection's filter, lookup and action plugins in ansible-playbook's
    own process, so that the worker forked for each task finds them imported.
"""

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
PACKAGE = "ansible_collections.dgx_spark.cluster.plugins"
KINDS = ("filter", "lookup", "action")


def plugin_modules(plugins: Path) -> list[str]:
    """The Python module name of each filter, lookup and action plugin under plugins/, as the
    plugin loader names it when it imports one."""
    return [
        f"{PACKAGE}.{kind}.{path.stem}"
        for kind in KINDS
        for path in sorted((plugins / kind).glob("*.py"))
        if not path.stem.startswith("_")
    ]


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "plugin_preload"
    CALLBACK_NEEDS_ENABLED = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in plugin_modules(PLUGINS):
            # One that cannot be imported here fails where a task uses it, as without this.
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112
                continue
