"""The key worker's request handling (``qim.apps.keys``): PREKEY_PUBLISH / PREKEY_FETCH of the
users whose ``qim.prekey-requests`` partitions the ``qim-keys`` group gave this worker, on the
co-partitioned ``DevicePreKeyBundle`` table; replies and low-water notices on
``qim.to-gateway``."""

from qim.agents.prekeys.directory import Handled, PreKeyDirectory, PreKeyOptions

__all__ = ["Handled", "PreKeyDirectory", "PreKeyOptions"]
