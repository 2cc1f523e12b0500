"""``Param``: one Appendix B default, declared once, read as a typed attribute.

Modelled on Faust's settings (``faust/types/settings``): each setting is declared in one place
with its type, default and documentation, and the documentation table is generated from the
declarations. A ``Param`` is also a descriptor, so ``settings.lane_count`` is typed ``int`` for
mypy while the value comes from the loaded ``Settings``.
"""

from __future__ import annotations

from dataclasses import dataclass, is_dataclass
from typing import Any, Generic, NoReturn, Protocol, TypeVar, cast, overload

from qim.params.units import SUFFIX_UNITS, Group, Unit

__all__ = ["Param", "ValueSource"]

T = TypeVar("T")

_SCALARS: tuple[type, ...] = (bool, int, float, str)


class ValueSource(Protocol):
    """What a ``Param`` reads its value from (``Settings``)."""

    def _value_of(self, name: str) -> object: ...


@dataclass(frozen=True)  # no slots: Param[X](...) sets __orig_class__
class Param(Generic[T]):
    """The declaration of one parameter.

    ``name`` is the spec's name verbatim. ``immutable`` means fixed at cluster creation (changing
    it re-routes every user); ``per_tenant`` means a tenant may override it, which is only true
    where the value is read with the tenant known. ``note`` records a decision or a deviation from
    the documents, for ``topology.md``.
    """

    name: str
    default: T
    unit: Unit
    group: Group
    doc: str
    immutable: bool = False
    per_tenant: bool = True
    to_be_measured: bool = False
    note: str = ""
    value_type: type[Any] | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    env_aliases: tuple[str, ...] = ()
    alias_of: str | None = None
    shares_row_with: str | None = None

    def __post_init__(self) -> None:
        problems = self._declaration_problems()
        if problems:
            raise TypeError(f"bad declaration of {self.name!r}: " + "; ".join(problems))

    def _declaration_problems(self) -> list[str]:
        problems: list[str] = []
        if self.immutable and self.per_tenant:
            problems.append("an immutable parameter cannot be per tenant")
        if self.alias_of is not None and self.per_tenant:
            problems.append("an alias cannot be per tenant")
        if self.default is None and self.value_type is None:
            problems.append("a None default needs an explicit value_type")
        expected = self.declared_type
        if self.default is not None and not isinstance(self.default, expected):
            problems.append(f"default {self.default!r} is not a {expected.__name__}")
        if expected is bool and not isinstance(self.default, bool | None):
            problems.append("bool parameter with a non-bool default")
        if expected not in _SCALARS and not is_dataclass(expected):
            problems.append(f"value type {expected!r} is neither a scalar nor a dataclass")
        if self.choices and expected is not str:
            problems.append("choices only apply to str parameters")
        if (expected in _SCALARS) and expected is not bool and expected is not str:
            for suffix, unit in SUFFIX_UNITS.items():
                if self.name.endswith(suffix) and self.unit != unit:
                    problems.append(f"name ends in {suffix} so the unit must be {unit!r}")
        return problems

    @property
    def declared_type(self) -> type[Any]:
        """The declared value type (``value_type``, else the default's type)."""
        if self.value_type is not None:
            return self.value_type
        return type(self.default)

    @property
    def nullable(self) -> bool:
        """True when the parameter has no value by default (unset, or not yet measured)."""
        return self.default is None

    @property
    def env_names(self) -> tuple[str, ...]:
        """``QIM_<NAME>`` plus any name the spec itself gives the variable."""
        return (f"QIM_{self.name.upper()}", *self.env_aliases)

    def __set_name__(self, owner: type, attribute: str) -> None:
        if attribute != self.name:
            raise TypeError(f"Param {self.name!r} is bound to attribute {attribute!r}")

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Param[T]: ...

    @overload
    def __get__(self, obj: ValueSource, objtype: type | None = None) -> T: ...

    def __get__(self, obj: ValueSource | None, objtype: type | None = None) -> Param[T] | T:
        if obj is None:
            return self
        return cast(T, obj._value_of(self.name))

    def __set__(self, obj: ValueSource, value: NoReturn) -> NoReturn:
        """Loaded values are read-only; a typo'd assignment fails for mypy and at run time."""
        raise AttributeError(f"{self.name} is read-only; use Settings.load() or for_tenant()")
