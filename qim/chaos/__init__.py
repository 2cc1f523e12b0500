"""``qim chaos``: faults injected into a running stack under a steady SDK load, with exact
accounting of what was acknowledged and what arrived.

* :mod:`qim.chaos.load` -- senders on the client SDK that retry each message with its own
  ``client_message_id`` (the client's part of 19.2.4 / 20.4.1) and reconnect after a close,
  and the recipients' mailbox read that says whether every acknowledged message arrived;
* :mod:`qim.chaos.faults` -- the fault steps (a broker restart today; process kills, pauses
  and a full disk are the same shape: ``async run(stack) -> dict``);
* :mod:`qim.chaos.broker_restart` -- ``qim chaos broker-restart``: N broker restarts under
  load, then a message to every conversation partition, then the delivery check and the
  producers' replacement counters, written as a report under ``bench/results/``.
"""
