"""YAML of the inventories as the tests read it: a vaulted value (the sim's sudo password,
``!vault``) stays an opaque string instead of failing the load."""

from __future__ import annotations

from pathlib import Path

import yaml


class _Loader(yaml.SafeLoader):
    pass


_Loader.add_constructor("!vault", lambda loader, node: "<vaulted>")


def load(path: Path):
    return yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)  # noqa: S506
