"""Chatroom rules (spec 14), pure: plain data in, decisions out, time as an argument.

* ``ids``: the room id form (``r:`` + name) and the room's explicit partition;
* ``admission``: ``room_msg_rate`` at the RoomWriter, decided up front (14.2);
* ``ring``: one room's short log: ``room_seq`` allocation, retention by time and count, the
  replay window and ``replay_truncated`` (14.3, 14.5, 7.12);
* ``targets``: which ConnectionShards a room broadcasts to, each a lease renewed by its
  gateway (14.1, 14.5);
* ``merge``: the ConnectionNode's 100 ms window that turns a room's messages into one
  ROOM_BATCH (``room_outbound_frame_rate``, 14.2);
* ``members``: the ConnectionNode's ``room_id -> connections`` map, kept from ROOM_JOIN /
  ROOM_LEAVE only (14.5).
"""
