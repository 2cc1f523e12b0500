"""The admin plane's group operations (spec A.3 #21-#22 notes: GroupAdd / GroupRemove).

* ``groups``: :class:`GroupAdmin`, AdminGroupRequest -> ``qim.conversation-requests`` at the
  group's conversation partition, AdminReply <- ``qim.admin-replies`` (``replies``);
* ``http`` / ``server``: the aiohttp endpoint (``X-Qim-Admin-Secret``), ``qim admin serve``;
* ``client`` / ``cli``: ``qim group create|add|remove|show`` over HTTP.
"""

from qim.admin.client import AdminHttpError, AdminUnreachable, GroupAdminClient
from qim.admin.groups import ACTIONS, AdminRejected, AdminTimeout, GroupAdmin
from qim.admin.http import make_group_admin_app
from qim.admin.replies import AdminReplyWaiter
from qim.admin.server import GroupAdminServer, serve_group_admin, start_group_admin_server
from qim.admin.wire import (
    ADMIN_ACTOR_HEADER,
    ADMIN_SECRET_HEADER,
    DEFAULT_GROUP_ADMIN_PORT,
    DEFAULT_GROUP_ADMIN_URL,
    ENV_ADMIN_SECRET,
    ENV_ADMIN_URL,
)

__all__ = [
    "ACTIONS",
    "ADMIN_ACTOR_HEADER",
    "ADMIN_SECRET_HEADER",
    "DEFAULT_GROUP_ADMIN_PORT",
    "DEFAULT_GROUP_ADMIN_URL",
    "ENV_ADMIN_SECRET",
    "ENV_ADMIN_URL",
    "AdminHttpError",
    "AdminRejected",
    "AdminReplyWaiter",
    "AdminTimeout",
    "AdminUnreachable",
    "GroupAdmin",
    "GroupAdminClient",
    "GroupAdminServer",
    "make_group_admin_app",
    "serve_group_admin",
    "start_group_admin_server",
]
