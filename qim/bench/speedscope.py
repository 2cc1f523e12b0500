"""Where a process spent its time: a summary of a py-spy speedscope profile.

Why a summary next to the raw file: bench/README.md names the hottest path per process, and a
reader should be able to check that claim with one command (``qim bench profile FILE``)
without a browser. Self time says what burns the CPU (``select`` is the event loop idling);
inclusive time over qim's own frames says which of our code paths it is under.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ProfileSummary", "summarize"]


@dataclass(frozen=True)
class ProfileSummary:
    total: float
    self_time: list[tuple[str, float]]
    """(frame, share of all samples), descending."""
    inclusive: list[tuple[str, float]]
    """(qim frame, share of all samples it is on the stack of), descending."""

    def lines(self) -> list[str]:
        out = [f"total sampled: {self.total:.1f} s", "-- self"]
        out += [f"{100 * share:5.1f}% {name}" for name, share in self.self_time]
        out.append("-- inclusive (qim frames)")
        out += [f"{100 * share:5.1f}% {name}" for name, share in self.inclusive]
        return out


def _label(frame: dict[str, Any]) -> str:
    path = str(frame.get("file", ""))
    for cut in ("site-packages/", "/work/main/"):
        path = path.split(cut)[-1]
    return f"{frame.get('name', '?')} ({path}:{frame.get('line', '')})"


def _is_qim(frame: dict[str, Any]) -> bool:
    path = str(frame.get("file", ""))
    return "/qim/" in path or path.startswith("qim/")


def summarize(path: Path, top: int = 15) -> ProfileSummary:
    """Aggregate every sampled stack of every thread of the profile at ``path``."""
    doc = json.loads(path.read_text())
    frames: list[dict[str, Any]] = doc["shared"]["frames"]
    own: Counter[int] = Counter()
    under: Counter[int] = Counter()
    total = 0.0
    for profile in doc["profiles"]:
        for stack, weight in zip(profile["samples"], profile["weights"], strict=True):
            total += weight
            if stack:
                own[stack[-1]] += weight
                for index in set(stack):
                    under[index] += weight
    if total <= 0:
        return ProfileSummary(0.0, [], [])
    self_time = [(_label(frames[i]), w / total) for i, w in own.most_common(top)]
    qim = [(i, w) for i, w in under.most_common() if _is_qim(frames[i])][:top]
    return ProfileSummary(total, self_time, [(_label(frames[i]), w / total) for i, w in qim])
