"""``client_version`` against ``minimum_client_version`` (spec §27.1.3, A.6 ``UPGRADE_REQUIRED``).

``AUTH.client_version`` is the client's full version string. Accepted shapes, compared by their
numeric dotted core: ``"3.2.1"``, ``"v3.2"``, ``"ios/3.2.1"`` (a ``platform/`` prefix is
ignored), ``"3.2.1+build.7"`` (build metadata ignored), ``"3.2.1-rc.1"`` (a pre-release sorts
just below its release, as in SemVer). Missing trailing components are zero (``3.2`` ==
``3.2.0``). Anything else is unparseable, and an unparseable client version never passes a
configured minimum: a client that cannot say what it is cannot prove it is new enough.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["ClientVersion", "client_version_at_least", "parse_client_version"]

_MAX_CHARS: Final = 128
_MAX_COMPONENTS: Final = 8
_CORE_RE: Final = re.compile(r"(\d{1,9}(?:\.\d{1,9}){0,7})([-+].*)?", re.ASCII)

ClientVersion = tuple[tuple[int, ...], int]
"""Sort key: (core padded to 8 components, 1 for a release / 0 for a pre-release)."""


def parse_client_version(text: object) -> ClientVersion | None:
    """A comparable key for ``text``, or ``None`` if it is not a version string."""
    if not isinstance(text, str) or len(text) > _MAX_CHARS or not text.isascii():
        return None
    text = text.strip().rsplit("/", 1)[-1]
    if text[:1] in ("v", "V"):
        text = text[1:]
    match = _CORE_RE.fullmatch(text)
    if match is None:
        return None
    core = tuple(int(part) for part in match.group(1).split("."))
    suffix = match.group(2) or ""
    if suffix.startswith("-") and len(suffix) == 1:
        return None
    release = 0 if suffix.startswith("-") else 1
    return core + (0,) * (_MAX_COMPONENTS - len(core)), release


def client_version_at_least(client_version: object, minimum: str) -> bool:
    """True iff ``client_version`` is known and >= ``minimum`` (which must itself parse)."""
    floor = parse_client_version(minimum)
    if floor is None:
        raise ValueError(f"minimum_client_version {minimum!r} is not a version")
    have = parse_client_version(client_version)
    return have is not None and have >= floor
