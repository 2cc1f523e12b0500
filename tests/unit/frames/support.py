"""Shared test helpers: every frame model, a full instance of each, hypothesis strategies.

Both the full instances and the strategies are derived from ``msgspec.inspect`` so a field
added to a model is covered without touching the tests.
"""

from __future__ import annotations

from typing import Any

import msgspec
import msgspec.inspect as mi
from hypothesis import strategies as st

from qim.schemas.frames import (
    DEFAULT_LIMITS,
    FRAMES_BY_NAME,
    Body,
    Frame,
    FrameSpec,
    Limits,
    Role,
    decode_message,
    encode_frame,
)

_U64_MAX = 2**64 - 1


def all_models() -> list[tuple[FrameSpec, type[Body], Role]]:
    """(frame, body class, sender) for all 45 body classes of the 42 frames."""
    out: list[tuple[FrameSpec, type[Body], Role]] = []
    for spec in FRAMES_BY_NAME.values():
        if spec.uplink is not None:
            out.append((spec, spec.uplink, Role.CLIENT))
        if spec.downlink is not None:
            out.append((spec, spec.downlink, Role.SERVER))
    return out


def receiver(sender: Role) -> Role:
    return Role.SERVER if sender is Role.CLIENT else Role.CLIENT


def _full_value(name: str, t: mi.Type) -> Any:
    if isinstance(t, mi.UnionType):
        return _full_value(name, next(x for x in t.types if not isinstance(x, mi.NoneType)))
    if isinstance(t, mi.IntType):
        hi = _U64_MAX if t.le is None else t.le
        return 2**63 + 5 if hi == _U64_MAX else min(hi, 7)  # exercise the uint64 top half
    if isinstance(t, mi.StrType):
        return f"{name}-é"
    if isinstance(t, mi.BytesType):
        size = t.min_length if t.min_length else 3
        return bytes((i * 37 + 1) & 0xFF for i in range(size))
    if isinstance(t, mi.BoolType):
        return True
    if isinstance(t, mi.StructType):
        return full_instance(t.cls)  # type: ignore[arg-type]  # all ours are Body
    if isinstance(t, mi.VarTupleType):
        return (_full_value(name, t.item_type), _full_value(name, t.item_type))
    if isinstance(t, mi.DictType):
        return {"k1": _full_value(name, t.value_type), "k2": _full_value(name, t.value_type)}
    raise TypeError(f"no full value for {t!r}")


def full_instance(cls: type[Body]) -> Body:
    """An instance with every field set to a non-default value."""
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return cls(**{f.name: _full_value(f.name, f.type) for f in info.fields})


def strategy_for(t: mi.Type) -> st.SearchStrategy[Any]:
    if isinstance(t, mi.UnionType):
        return st.one_of([strategy_for(x) for x in t.types])
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.IntType):
        lo = 0 if t.ge is None else t.ge
        hi = _U64_MAX if t.le is None else t.le
        return st.integers(min_value=lo, max_value=hi)
    if isinstance(t, mi.StrType):
        return st.text(max_size=12)
    if isinstance(t, mi.BytesType):
        return st.binary(min_size=t.min_length or 0, max_size=t.max_length or 24)
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.StructType):
        return model_strategy(t.cls)  # type: ignore[arg-type]  # all ours are Body
    if isinstance(t, mi.VarTupleType):
        return st.lists(strategy_for(t.item_type), max_size=3).map(tuple)
    if isinstance(t, mi.DictType):
        return st.dictionaries(strategy_for(t.key_type), strategy_for(t.value_type), max_size=3)
    raise TypeError(f"no strategy for {t!r}")


def model_strategy(cls: type[Body]) -> st.SearchStrategy[Body]:
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    return st.builds(cls, **{f.name: strategy_for(f.type) for f in info.fields})


def corpus() -> list[tuple[bytes, Role]]:
    """One valid, fully populated frame per body class, with the role that receives it."""
    return [
        (encode_frame(full_instance(cls), request_id=i + 1), receiver(sender))
        for i, (_spec, cls, sender) in enumerate(all_models())
    ]


def wire_keys(body: Body) -> int:
    """How many keys the encoded map carries (defaults are omitted)."""
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(body))
    assert isinstance(decoded, dict)
    return len(decoded)


def body_of(message: bytes, role: Role, *, limits: Limits = DEFAULT_LIMITS) -> Body:
    """Decode one whole frame that must be of a known opcode; its body."""
    frame = decode_message(message, role, limits=limits)
    assert isinstance(frame, Frame), frame
    return frame.body
