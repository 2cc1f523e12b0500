"""The MailboxNode: the owner of each MailboxShard, its store, reads and online push.

Runs inside ``faust -A qim.apps.mailbox worker`` as plain aiokafka services. Consumes
``qim.dispatch`` (the shard log it folds into one RocksDB per shard), ``qim.presence`` and
``qim.user-requests``; produces PushBatches, session pushes and replies on ``qim.to-gateway``
and quota crossings on ``qim.user-quota``. ``replay`` and ``projection_replay`` are the
topology replays behind ``qim replay mailbox`` / ``qim replay projections``.
"""
