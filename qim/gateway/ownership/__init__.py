"""ConnectionShard ownership through the gateways' consumer group (direction.md 4.1).

``shards`` is the Kafka side (the group member, the lease, the shard -> endpoint map);
``assignor`` holds its pure parts: the assignment algorithm and the wire encodings.
"""
