"""The RoomWriter (spec 14): ``writer`` (the service), ``definitions`` (which rooms exist).

Consumes ``qim.room-requests`` (group ``qim-room-writers``), produces RoomRecords to
``qim.room-log`` and replies and broadcasts to ``qim.to-gateway``; reads ``qim.rooms``.
Rooms never touch mailboxes, history, session lists, unread or push (14.1).
"""
