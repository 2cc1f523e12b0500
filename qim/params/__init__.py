"""Every Appendix B default parameter, declared once, typed and documented.

``Settings.load()`` reads defaults, ``QIM_<NAME>`` environment variables and explicit overrides,
validates the spec's relations (powers of two, shard multiples, the lease inequality ...) and
gives typed access: ``settings.lane_count``. ``settings.for_tenant(tenant_id, overrides)`` is a
tenant's view. ``docs/parameters.md`` is generated from the declarations (``python -m
qim.params``). Pure: no asyncio, faust, aiokafka, websockets, redis or rocksdict.
"""

from __future__ import annotations

from qim.params.declarations import PARAMS
from qim.params.errors import (
    ConstraintError,
    ImmutableParamError,
    NotPerTenantError,
    ParamError,
    ParamValueError,
    UnknownParamError,
)
from qim.params.param import Param
from qim.params.render import render_markdown
from qim.params.settings import Settings, lookup
from qim.params.units import GROUP_ROW_COUNTS, GROUP_TITLES, GROUPS, Group, Unit
from qim.params.validation import CONSTRAINTS, Constraint, check_constraints
from qim.params.values import (
    EventWindow,
    ExponentialBackoff,
    FloatRange,
    IdleTimeout,
    LatencyTarget,
    MemoryShare,
    MsRange,
    PageLimit,
    PingBackoff,
    PpsBudget,
    PriorityOrder,
    QuietHours,
    Rate,
    RateTier,
    SustainedShare,
    TcpKeepalive,
    TieredRate,
    UploadQuota,
    Watermark,
)

__all__ = [
    "CONSTRAINTS",
    "GROUPS",
    "GROUP_ROW_COUNTS",
    "GROUP_TITLES",
    "PARAMS",
    "Constraint",
    "ConstraintError",
    "EventWindow",
    "ExponentialBackoff",
    "FloatRange",
    "Group",
    "IdleTimeout",
    "ImmutableParamError",
    "LatencyTarget",
    "MemoryShare",
    "MsRange",
    "NotPerTenantError",
    "PageLimit",
    "Param",
    "ParamError",
    "ParamValueError",
    "PingBackoff",
    "PpsBudget",
    "PriorityOrder",
    "QuietHours",
    "Rate",
    "RateTier",
    "Settings",
    "SustainedShare",
    "TcpKeepalive",
    "TieredRate",
    "Unit",
    "UnknownParamError",
    "UploadQuota",
    "Watermark",
    "check_constraints",
    "lookup",
    "render_markdown",
]
