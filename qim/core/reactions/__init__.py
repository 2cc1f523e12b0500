"""Reactions (spec 13.6, 7.15): the aggregated-transient delivery class, as pure rules.

* :mod:`~qim.core.reactions.store` -- MessageStore keys and values of ``MessageReactionSummary``
  (keyspace ``s``) and ``MessageReaction`` detail (keyspace ``x``), the archive writes of a
  :class:`~qim.schemas.records.outbox.MessageReacted` and of a recall, and the read side
  (the history join, ``self_reaction_keys``, PULL_REACTIONS pages);
* :mod:`~qim.core.reactions.decide` -- REACT decided like a send: membership, target, key,
  ``per_user_reaction_rate``, the 13.6.2 idempotency key, the record carrying the result.

Submodules are imported by path (this package re-exports nothing): the history archiver and
PULL_HISTORY import the store half, and the writer imports the decision half, so neither side
pulls the other in.
"""
