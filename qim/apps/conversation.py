"""The conversation app: ConversationWriter, GroupMembership, HistoryArchiver, FanoutCoordinator.

Run with `faust -A qim.apps.conversation worker`. Its agents arrive with the conversation issue;
today it joins the cluster, owns nothing and reports healthy.
"""

from qim.apps.base import make_app

app = make_app("qim-conversation")
