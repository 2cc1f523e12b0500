"""Per-key rate limits with truthful retry hints (spec 20.4.1), pure, time as an argument."""

from qim.core.ratelimit.bucket import Admit, KeyedBuckets

__all__ = ["Admit", "KeyedBuckets"]
