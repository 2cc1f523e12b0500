"""``Settings``: the loaded parameter values, cluster-wide or for one tenant.

Precedence, lowest first: the declared default, the environment (``QIM_<NAME>``), then explicit
overrides (a config file or command line). Environment variables that name no parameter are
ignored, since ``QIM_`` also prefixes other configuration; an unknown name in ``overrides`` or in
tenant overrides is an error. Constraints are checked after every merge, so an invalid
combination never reaches a worker.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping
from typing import Any, Self

from qim.params.coerce import coerce_override, parse_env
from qim.params.declarations import (
    PARAMS,
    ConnectionAndHeartbeat,
    ConsistencyAndDisasterRecovery,
    EphemeralAndChatroom,
    FlowControlAndLimits,
    MailboxAndDispatchRuntime,
    NamedInProse,
    OfflinePush,
    SequencesAndIdempotency,
    SessionListAndUnread,
    ShardingAndRouting,
    SyncAndRetention,
    ToBeMeasured,
)
from qim.params.errors import (
    ImmutableParamError,
    NotPerTenantError,
    ParamError,
    ParamValueError,
    UnknownParamError,
)
from qim.params.param import Param
from qim.params.validation import check_constraints

__all__ = ["Settings", "lookup"]


def lookup(name: str) -> Param[Any]:
    """The declaration of ``name``, or ``UnknownParamError`` with a spelling hint."""
    try:
        return PARAMS[name]
    except KeyError:
        close = difflib.get_close_matches(name, PARAMS, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownParamError(f"unknown parameter {name!r}{hint}") from None


class Settings(
    ShardingAndRouting,
    SequencesAndIdempotency,
    SyncAndRetention,
    ConnectionAndHeartbeat,
    FlowControlAndLimits,
    MailboxAndDispatchRuntime,
    OfflinePush,
    ConsistencyAndDisasterRecovery,
    SessionListAndUnread,
    EphemeralAndChatroom,
    ToBeMeasured,
    NamedInProse,
):
    """Validated, read-only parameter values: ``settings.lane_count`` or ``settings["lane_count"]``.

    Build with ``Settings.load()``; ``for_tenant()`` gives a tenant's view, which is a
    ``Settings`` too, so code that takes settings does not care which one it got.
    """

    __slots__ = ("_tenant_id", "_values")

    _values: Mapping[str, object]
    _tenant_id: str | None

    def __init__(self, values: Mapping[str, object], tenant_id: str | None = None) -> None:
        """Wrap already-merged values; prefer ``load()``, which parses and validates them."""
        missing = sorted(set(PARAMS) - set(values))
        extra = sorted(set(values) - set(PARAMS))
        if missing or extra:
            raise ParamError(f"values must name every parameter: missing {missing}, extra {extra}")
        check_constraints(values, context=f"tenant {tenant_id!r}" if tenant_id else "")
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_tenant_id", tenant_id)

    @classmethod
    def load(
        cls,
        overrides: Mapping[str, object] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Self:
        """Defaults, then ``env`` (``os.environ`` when None), then ``overrides``; validated."""
        environ = os.environ if env is None else env
        values: dict[str, object] = {name: p.default for name, p in PARAMS.items()}
        for name, param in PARAMS.items():
            found = _from_env(param, environ)
            if found is not _ABSENT:
                values[name] = found
        for name, raw in (overrides or {}).items():
            param = lookup(name)
            _refuse_alias(param)
            values[name] = coerce_override(param, raw)
        _resolve_aliases(values)
        return cls(values)

    def for_tenant(
        self, tenant_id: str, tenant_overrides: Mapping[str, object] | None = None
    ) -> Self:
        """This cluster's values with ``tenant_overrides`` applied, re-validated as a whole."""
        if self._tenant_id is not None:
            raise ParamError(f"already the view of tenant {self._tenant_id!r}")
        if not tenant_id:
            raise ParamError("tenant_id must be a non-empty string")
        values = dict(self._values)
        for name, raw in (tenant_overrides or {}).items():
            param = lookup(name)
            if param.immutable:
                raise ImmutableParamError(
                    f"{name} is cluster-immutable (changing it re-routes every user); "
                    f"tenant {tenant_id!r} cannot override it"
                )
            _refuse_alias(param)
            if not param.per_tenant:
                raise NotPerTenantError(
                    f"{name} is a cluster/node-level value, read without a tenant; "
                    f"tenant {tenant_id!r} cannot override it"
                )
            values[name] = coerce_override(param, raw)
        return type(self)(values, tenant_id)

    @property
    def tenant_id(self) -> str | None:
        """The tenant this view is for; None for the cluster-wide values."""
        return self._tenant_id

    def _value_of(self, name: str) -> object:
        return self._values[name]

    def __getitem__(self, name: str) -> object:
        lookup(name)
        return self._values[name]

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def as_dict(self) -> dict[str, object]:
        """A copy of every value, in declaration order."""
        return dict(self._values)

    def changed(self) -> dict[str, object]:
        """Only the values that differ from the declared defaults (for a startup log line)."""
        return {n: v for n, v in self._values.items() if v != PARAMS[n].default}

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Settings are read-only; cannot set {name!r}")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settings):
            return NotImplemented
        return self._tenant_id == other._tenant_id and self._values == other._values

    __hash__ = None  # type: ignore[assignment]  # equal by value but holds a dict

    def __repr__(self) -> str:
        scope = f"tenant={self._tenant_id!r}" if self._tenant_id else "cluster"
        return f"<Settings {scope} changed={self.changed()!r}>"


_ABSENT: Any = object()


def _from_env(param: Param[Any], environ: Mapping[str, str]) -> object:
    present = [(var, environ[var]) for var in param.env_names if var in environ]
    if not present:
        return _ABSENT
    _refuse_alias(param)
    parsed = [(var, parse_env(param, var, text)) for var, text in present]
    first_var, first = parsed[0]
    for var, value in parsed[1:]:
        if value != first:
            raise ParamValueError(f"{first_var} and {var} both set {param.name}, differently")
    return first


def _refuse_alias(param: Param[Any]) -> None:
    if param.alias_of is not None:
        raise ParamValueError(
            f"{param.name} is an alias of {param.alias_of} and must not be tuned on its own; "
            f"set {param.alias_of}"
        )


def _resolve_aliases(values: dict[str, object]) -> None:
    for name, param in PARAMS.items():
        if param.alias_of is not None:
            values[name] = values[param.alias_of]
