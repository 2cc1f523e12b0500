"""Every Appendix B default, declared once, grouped as the spec groups them.

One class per group holds that group's ``Param`` descriptors; ``Settings`` inherits them all,
so ``settings.<name>`` is typed. ``PARAMS`` lists the declarations in the spec's order.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from qim.params.declarations.connection import ConnectionAndHeartbeat
from qim.params.declarations.limits import FlowControlAndLimits
from qim.params.declarations.mailbox import MailboxAndDispatchRuntime, OfflinePush
from qim.params.declarations.measured import NamedInProse, ToBeMeasured
from qim.params.declarations.recovery import ConsistencyAndDisasterRecovery
from qim.params.declarations.routing import SequencesAndIdempotency, ShardingAndRouting
from qim.params.declarations.session import EphemeralAndChatroom, SessionListAndUnread
from qim.params.declarations.sync import SyncAndRetention
from qim.params.param import Param
from qim.params.units import Group

__all__ = [
    "GROUP_CLASSES",
    "PARAMS",
    "ConnectionAndHeartbeat",
    "ConsistencyAndDisasterRecovery",
    "EphemeralAndChatroom",
    "FlowControlAndLimits",
    "MailboxAndDispatchRuntime",
    "NamedInProse",
    "OfflinePush",
    "SequencesAndIdempotency",
    "SessionListAndUnread",
    "ShardingAndRouting",
    "SyncAndRetention",
    "ToBeMeasured",
]

GROUP_CLASSES: Final[dict[Group, type]] = {
    "B.1": ShardingAndRouting,
    "B.2": SequencesAndIdempotency,
    "B.3": SyncAndRetention,
    "B.4": ConnectionAndHeartbeat,
    "B.5": FlowControlAndLimits,
    "B.5.1": MailboxAndDispatchRuntime,
    "B.5.2": OfflinePush,
    "B.5.3": ConsistencyAndDisasterRecovery,
    "B.6": SessionListAndUnread,
    "B.6.1": EphemeralAndChatroom,
    "B.7": ToBeMeasured,
    "prose": NamedInProse,
}


def _collect() -> Mapping[str, Param[Any]]:
    found: dict[str, Param[Any]] = {}
    for group, cls in GROUP_CLASSES.items():
        for param in vars(cls).values():
            if not isinstance(param, Param):
                continue
            if param.group != group:
                raise TypeError(f"{param.name} is declared in {group} but says {param.group}")
            if param.name in found:
                raise TypeError(f"{param.name} is declared twice")
            found[param.name] = param
    for param in found.values():
        for ref in (param.alias_of, param.shares_row_with):
            if ref is not None and ref not in found:
                raise TypeError(f"{param.name} refers to undeclared {ref}")
    return MappingProxyType(found)


PARAMS: Final[Mapping[str, Param[Any]]] = _collect()
