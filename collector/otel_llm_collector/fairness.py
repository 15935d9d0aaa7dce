"""Per-peer shares of the receivers' slots, so one greedy client cannot lock the others out.

A *peer* is the tenant a request's bearer token names when the receiver checks tokens, else the
client's source address. ``PeerSlots`` is one capacity (connections, calls in flight) that every
peer shares, each holding at most ``share`` of it: a peer that asks for more is refused at once
(``reason="peer_share"``) while the rest of the capacity stays free for others, so an honest peer
always finds a slot unless more than ``1 / share`` peers are saturating it together. A peer in
``trusted_peers`` (the load-balancing tier in front of scaled-out gateways: every span arrives from
it) is held only to the capacity.

State is bounded by construction: a peer has an entry only while it holds a slot, so a table holds
at most ``capacity`` entries whatever the number of sources; counters carry a reason, never a
source. ``ByteBudgets`` (per-peer token buckets) keeps at most ``max_peers`` entries and forgets the
least recently seen peer first (a forgotten peer starts again with a full bucket).
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Iterable

PEER_SHARE = "peer_share"  # the refusal reason when a peer holds its whole share
BUSY = "busy"  # the capacity itself is taken

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class Peer:
    """Who holds a slot: ``tenant`` (the token's) when the receiver checks tokens, else ``None``; ``address``
    the source address; ``trusted`` when that address is in ``trusted_peers``."""

    address: str
    tenant: str | None = None
    trusted: bool = False

    @property
    def key(self) -> str:
        """The identity shares are kept by: the tenant when known, else the source address."""
        return "tenant:" + self.tenant if self.tenant is not None else "address:" + self.address


class TrustedPeers:
    """``trusted_peers``: addresses or CIDR blocks (IPv4 or IPv6)."""

    def __init__(self, entries: Iterable[str] = ()) -> None:
        self.networks: tuple[Network, ...] = tuple(parse_network(e) for e in entries)

    def __contains__(self, address: str) -> bool:
        if not self.networks:
            return False
        try:
            ip = ipaddress.ip_address(address)
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped  # a dual-stack socket reports IPv4 clients as ::ffff:a.b.c.d
        return any(ip in n for n in self.networks if n.version == ip.version)

    def peer(self, address: str, tenant: str | None = None) -> Peer:
        return Peer(address, tenant, address in self)


def parse_network(entry: str) -> Network:
    """One ``trusted_peers`` entry: ``10.0.0.0/8``, ``127.0.0.2``, ``::1``; ValueError with the entry otherwise."""
    if not isinstance(entry, str) or not entry.strip():
        raise ValueError(f"expected an address or CIDR block, got {entry!r}")
    try:
        return ipaddress.ip_network(entry.strip(), strict=False)
    except ValueError:
        raise ValueError(f"{entry!r} is neither an IP address nor a CIDR block") from None


def share_of(capacity: int, share: float) -> int:
    """A peer's slots: ``share`` of ``capacity``, at least one."""
    return max(1, math.floor(capacity * share))


class PeerSlots:
    """``capacity`` slots; each peer (by ``Peer.key``) at most ``limit`` of them, trusted peers exempt.

    Thread-safe. ``acquire`` returns None when a slot was taken, else the refusal reason. A slot taken with
    ``peer=None`` counts toward the capacity only (a connection whose tenant is not known yet); ``bind``
    charges it to a peer later."""

    def __init__(self, capacity: int, share: float) -> None:
        self.capacity = capacity
        self.limit = share_of(capacity, share)
        self._held: dict[str, int] = {}  # peers holding slots now (at most ``capacity`` entries)
        self._total = 0
        self._lock = threading.Lock()

    def acquire(self, peer: Peer | None) -> str | None:
        with self._lock:
            if self._total >= self.capacity:
                return BUSY
            if peer is not None and not peer.trusted:
                key = peer.key
                n = self._held.get(key, 0)
                if n >= self.limit:
                    return PEER_SHARE
                self._held[key] = n + 1
            self._total += 1
            return None

    def bind(self, old: Peer | None, new: Peer) -> str | None:
        """Move a held slot from ``old`` (None: the capacity only) to ``new``; a refusal leaves it with ``old``."""
        if old is not None and old.key == new.key and old.trusted == new.trusted:
            return None
        with self._lock:
            if not new.trusted:
                n = self._held.get(new.key, 0)
                if n >= self.limit:
                    return PEER_SHARE
                self._held[new.key] = n + 1
            self._drop(old)
            return None

    def release(self, peer: Peer | None) -> None:
        with self._lock:
            self._drop(peer)
            self._total -= 1

    def _drop(self, peer: Peer | None) -> None:
        if peer is None or peer.trusted:
            return
        n = self._held.get(peer.key, 0) - 1
        if n > 0:
            self._held[peer.key] = n
        else:
            self._held.pop(peer.key, None)

    @property
    def in_use(self) -> int:
        return self._total

    def held_by(self, peer: Peer) -> int:
        """Slots ``peer`` holds now (tests and logs)."""
        return self._held.get(peer.key, 0)

    @property
    def peers(self) -> int:
        """Peers holding slots now (bounded by ``capacity``)."""
        return len(self._held)


class ByteBudgets:
    """A token bucket per peer: ``rate`` bytes a second, bursts up to ``burst``; at most ``max_peers`` buckets.

    ``take(peer, n)`` returns 0 when the peer may spend ``n`` bytes now, else the seconds until it may
    (for Retry-After). A request larger than ``burst`` is allowed on a full bucket (it empties it, and the
    peer then waits for its debt to refill), so the largest body the receiver accepts is never refused
    forever. Trusted peers are not metered."""

    def __init__(self, rate: float, burst: float, max_peers: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.max_peers = rate, burst, max_peers
        self._clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)
        self._lock = threading.Lock()
        self.evictions = 0

    def take(self, peer: Peer, n: int) -> float:
        if peer.trusted or self.rate <= 0:
            return 0.0
        now = self._clock()
        key = peer.key
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.burst, now))
            tokens = min(self.burst, tokens + (now - at) * self.rate)
            if tokens >= min(n, self.burst):
                tokens -= n  # may go negative for a body above the burst: the debt is waited off
                wait = 0.0
            else:
                wait = (min(n, self.burst) - tokens) / self.rate
            self._buckets[key] = (tokens, now)
            while len(self._buckets) > self.max_peers:
                self._buckets.popitem(last=False)
                self.evictions += 1
            return wait

    def __len__(self) -> int:
        return len(self._buckets)
