"""Online push onto this node's sockets: PushBatches, and the SESSION_DELTA merge window.

``delivery`` writes one PushBatch to its connections with the shared body encoded once (10.3),
``delta_merge`` holds the node's SESSION_DELTA / BADGE_UPDATE merge window (12.6.3).
"""
