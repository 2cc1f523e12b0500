"""The FanoutCoordinator: outbox records in, one GroupDispatch per target MailboxShard out.

Runs inside ``faust -A qim.apps.conversation worker`` as a plain aiokafka service. Consumes
``qim.outbox`` (read committed); produces ``qim.dispatch`` at the explicit partition of each
target shard (member slices before the dispatches that pin their version), and commits its
outbox offsets once the dispatches are acknowledged.
"""
