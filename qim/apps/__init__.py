"""Faust apps, one per topic group: the only modules that wire agents, tables and topics."""

APP_MODULES: tuple[str, ...] = (
    "qim.apps.conversation",
    "qim.apps.mailbox",
    "qim.apps.notify",
    "qim.apps.keys",
    "qim.apps.rooms",
)

__all__ = ["APP_MODULES"]
