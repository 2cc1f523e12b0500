"""The conversation app's write side: the ConversationWriter and what it owns.

Runs inside ``faust -A qim.apps.conversation worker`` as plain aiokafka services. Consumes
``qim.conversation-requests`` (sends, amends, membership, history reads) and ``qim.user-quota``;
produces the outbox (``qim.outbox``, one Kafka transaction per batch with the request offsets),
replies on ``qim.to-gateway`` and checkpoints on ``qim.writer-snapshots``. ``history_replay``
rebuilds a partition's MessageStore from the outbox for ``qim replay history``.
"""
