"""Media frames, opcodes 0x0700-0x07FF: MEDIA_TICKET (exchanged for a signed URL, §13.1)."""

from __future__ import annotations

import msgspec

from qim.schemas.frames.base import U64, Body

__all__ = ["MediaTicket"]


class MediaTicket(Body):
    """MEDIA_TICKET (A.3 #17): ``intent`` is "upload" or "download"; wire key ``bytes``."""

    intent: str = "upload"
    object_id: str = ""
    byte_size: U64 = msgspec.field(default=0, name="bytes")
