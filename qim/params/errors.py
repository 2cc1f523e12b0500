"""Errors raised while loading parameters; all are ``ValueError`` so a boot fails loudly."""

from __future__ import annotations

__all__ = [
    "ConstraintError",
    "ImmutableParamError",
    "NotPerTenantError",
    "ParamError",
    "ParamValueError",
    "UnknownParamError",
]


class ParamError(ValueError):
    """Base class: a configuration the process must not start with."""


class UnknownParamError(ParamError):
    """A name that no declaration has (usually a typo)."""


class ParamValueError(ParamError):
    """A value of the wrong type, outside its bounds, or not parseable from the environment."""


class NotPerTenantError(ParamError):
    """A tenant tried to override a value that is read without the tenant in hand."""


class ImmutableParamError(NotPerTenantError):
    """A tenant tried to override a cluster-immutable value (it would re-route users)."""


class ConstraintError(ParamError):
    """Values that are fine one by one but break a relation the spec requires."""
