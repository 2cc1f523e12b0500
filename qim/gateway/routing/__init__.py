"""Business frames to the workers and their replies back, through Kafka.

``rules`` (pure) maps a frame to its conversation-request envelope and partition; ``forwarder``
produces it; ``router`` answers from ``qim.to-gateway``; ``replies`` (pure) finds the live
connection a reply is for; ``mailbox_requests`` does the same for the MailboxNode's user requests.
"""
