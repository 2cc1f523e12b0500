"""The mailbox app: MailboxNode, SessionProjection and badges.

Run with `faust -A qim.apps.mailbox worker`. Its agents arrive with the mailbox issue; today it
joins the cluster, owns nothing and reports healthy.
"""

from qim.apps.base import make_app

app = make_app("qim-mailbox")
