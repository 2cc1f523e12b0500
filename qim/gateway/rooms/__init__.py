"""The ConnectionNode's chatrooms (spec 14): ``router`` (frames, replies, broadcasts, merging)."""
