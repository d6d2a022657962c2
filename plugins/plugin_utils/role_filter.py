# Copyright: contributors to the dgx_spark.cluster collection
# SPDX-License-Identifier: GPL-3.0-or-later
"""One filter per role: ``value | dgx_spark.cluster.<role>('<operation>', ...)`` calls the
role's operation with the value and the further arguments. The operations are the role's own
decisions (pure functions over plugins/module_utils), not a public interface: one name per
role keeps ``ansible-doc -t filter`` to what the collection means to keep."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def role_filter(role: str, operations: dict):
    """The filter named ``role`` that runs ``operations[operation](value, *args, **kwargs)``."""

    def run(value, operation, *args, **kwargs):
        try:
            chosen = operations[operation]
        except (KeyError, TypeError):
            raise AnsibleFilterError(
                f"dgx_spark.cluster.{role}: no operation {operation!r}; "
                f"known: {', '.join(sorted(operations))}"
            ) from None
        return chosen(value, *args, **kwargs)

    run.__name__ = role
    run.__doc__ = f"The {role} role's operations: {', '.join(sorted(operations))}."
    return run
