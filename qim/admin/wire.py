"""Names the admin endpoint and its clients share: headers, default address, environment."""

from __future__ import annotations

from typing import Final

__all__ = [
    "ADMIN_ACTOR_HEADER",
    "ADMIN_AS_MEMBER_HEADER",
    "ADMIN_SECRET_HEADER",
    "DEFAULT_GROUP_ADMIN_PORT",
    "DEFAULT_GROUP_ADMIN_URL",
    "ENV_ADMIN_SECRET",
    "ENV_ADMIN_URL",
]

ADMIN_SECRET_HEADER: Final = "X-Qim-Admin-Secret"  # the same header as qim.auth.admin
ADMIN_ACTOR_HEADER: Final = "X-Qim-Admin-Actor"
ADMIN_AS_MEMBER_HEADER: Final = "X-Qim-Admin-As-Member"
"""``1``: the actor is a group member on whose behalf the change is made (roles apply)."""
DEFAULT_GROUP_ADMIN_PORT: Final = 16091  # the auth admin endpoint has 16090
DEFAULT_GROUP_ADMIN_URL: Final = f"http://127.0.0.1:{DEFAULT_GROUP_ADMIN_PORT}"
ENV_ADMIN_SECRET: Final = "QIM_ADMIN_SECRET"
ENV_ADMIN_URL: Final = "QIM_ADMIN_URL"
