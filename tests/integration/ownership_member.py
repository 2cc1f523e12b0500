"""One ShardOwnership member in its own process, so a test can SIGKILL or SIGSTOP it.

    python -m tests.integration.ownership_member --bootstrap HOST:PORT --group G --endpoint URL

Protocol on stdio, one JSON object per line. Out: {"event": "assigned"|"revoked", "shards": R}
on every callback, and {"event": "state", "owned": R, "seq": int|null, "rebalancing": bool,
"map": {endpoint: R}} in answer to a `state` line (R = inclusive ranges). In: `state`, or
`stop` / end of input for a graceful stop (so the member also goes away with its test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from qim.gateway.ownership.assignor import to_ranges
from qim.gateway.ownership.shards import ShardOwnership


def emit(doc: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    sys.stdout.flush()


def state_of(member: ShardOwnership) -> dict[str, object]:
    owner_map = member.owner_map
    by_endpoint: dict[str, object] = {}
    if owner_map is not None:
        by_endpoint = {e.endpoint: to_ranges(ps) for e, ps in owner_map.owners().items()}
    return {
        "event": "state",
        "owned": to_ranges(member.owned),
        "seq": member.assignment_seq,
        "rebalancing": member.rebalancing,
        "map": by_endpoint,
    }


async def run(args: argparse.Namespace) -> None:
    member = ShardOwnership(
        args.bootstrap,
        args.group,
        args.endpoint,
        tls_endpoint=args.tls_endpoint,
        topic=args.topic,
        session_timeout_ms=args.session_ms,
        heartbeat_interval_ms=args.heartbeat_ms,
        on_assigned=lambda s: emit({"event": "assigned", "shards": to_ranges(s)}),
        on_revoked=lambda s: emit({"event": "revoked", "shards": to_ranges(s)}),
    )
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await member.start()
    emit({"event": "started"})
    try:
        while True:
            line = (await reader.readline()).decode().strip()
            if line == "state":
                emit(state_of(member))
            elif line in ("stop", ""):
                return
    finally:
        await member.stop()
        emit({"event": "stopped"})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--tls-endpoint", default=None)
    parser.add_argument("--topic", default="qim.to-gateway")
    parser.add_argument("--session-ms", type=int, default=6000)
    parser.add_argument("--heartbeat-ms", type=int, default=1000)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
