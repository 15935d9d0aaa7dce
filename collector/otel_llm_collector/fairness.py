"""Per-peer shares of the receivers' slots that bite only under contention (max-min fairness).

A *peer* is the tenant a request's bearer token names when the receiver checks tokens, else the
client's source address. ``PeerSlots`` is one capacity (connections, gRPC calls in flight, bodies being
processed). While it has free slots, any peer takes one, however many it holds: a host running many
instrumented processes is one peer and may use what nobody else needs. When it is full, a newcomer gets a
slot at the expense of the peer furthest above its fair share (``capacity / peers holding slots``) - first
that peer's idle keep-alive connections (idle for at least ``grace``), then its slowest bodies (older than
``grace`` and below ``min_rate`` bytes a second, as Apache's and nginx's request-rate limits do) - and only
of a peer holding more than the newcomer, so the shares converge to max-min. A newcomer of the same peer
may take that peer's own idle or slow slot: a slow or idle connection never outranks a live request from
the same address. The slot so taken passes its age on (``Slot.origin``): until the newcomer has served a
request, its grace counts from where the replaced slot's did, so a peer that reopens each connection the
moment it is cut cannot keep its slots younger than ``grace`` by cycling them through itself (a body's rate
is still its own: bytes since it began). A live slot (a request being parsed or processed, a gRPC message being handled) is never
taken. With nothing to take, the newcomer is refused: ``peer_share`` when it holds at least its fair share
while other peers hold slots, else ``busy``. ``trusted_peers`` (the load-balancing tier) are held to the capacity only: they are never
charged to a share, never taken from, and take from nobody.

``grace`` is read on the injected clock, so tests decide what is idle or slow by advancing a fake clock.

State is bounded by construction: a slot exists only while held (at most ``capacity``; a slot taken from
its holder leaves the table at once), a peer has an entry only while it holds a slot; counters carry a
reason (``evicted_idle``, ``evicted_slow``, ``peer_share``, ``busy``), never a source.
``ByteBudgets`` (per-peer token buckets) keeps at most ``max_peers`` entries and forgets the least recently
seen peer first (a forgotten peer starts again with a full bucket).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterable, NamedTuple

PEER_SHARE = "peer_share"  # refused: the pool is full, nothing can be taken, and the peer holds its fair share
BUSY = "busy"  # refused: the pool is full, nothing can be taken, the peer is below its fair share
EVICTED_IDLE = "evicted_idle"  # a slot taken from an idle keep-alive connection
EVICTED_SLOW = "evicted_slow"  # a slot taken from a body arriving below min_rate

IDLE, RECEIVING, LIVE = "idle", "receiving", "live"
GRACE_S = 1.0  # how long a slot must have been idle, or receiving, before it can be taken
MIN_RATE = 1024  # bytes a second below which a body (or a gRPC call waiting for its message) is slow

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Clock = Callable[[], float]


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


@dataclass(eq=False)
class Slot:
    """One held slot: whose it is, what it is doing since when, and how to take it back (``on_evict``, called
    with the reason outside the pool's lock: it shuts the connection down or cancels the call)."""

    peer: Peer
    state: str
    since: float
    on_evict: Callable[[str], None] | None = None
    received: int = 0  # body bytes since ``since`` (state RECEIVING)
    # where the grace counts from when the slot replaced one of its own peer's, until it serves a request
    # (LIVE, then IDLE again): without it a peer reopening each cut connection would keep its slots young
    origin: float | None = None
    evicted: str | None = None  # the reason, once taken
    released: bool = field(default=False, repr=False)


class Grant(NamedTuple):
    """``slot`` when one was given (``evicted``: the reason of the slot taken for it, if any), else ``refused``."""

    slot: Slot | None
    refused: str | None = None
    evicted: str | None = None


class PeerSlots:
    """``capacity`` slots shared by peers (by ``Peer.key``) with max-min fairness under contention. Thread-safe."""

    def __init__(self, capacity: int, min_rate: float = MIN_RATE, grace: float = GRACE_S,
                 clock: Clock = time.monotonic) -> None:
        self.capacity = capacity
        self.min_rate, self.grace = min_rate, grace
        self._clock = clock
        self._held: dict[str, dict[Slot, None]] = {}  # peer key -> its slots (insertion order: oldest first)
        self._total = 0
        self._lock = threading.Lock()

    def acquire(self, peer: Peer, state: str = LIVE, on_evict: Callable[[str], None] | None = None) -> Grant:
        now = self._clock()
        victim: Slot | None = None
        with self._lock:
            if self._total >= self.capacity:
                if peer.trusted:
                    return Grant(None, BUSY)
                victim = self._victim(peer.key, now)
                if victim is None:
                    mine = len(self._held.get(peer.key, ()))
                    peers = len(self._held) + (peer.key not in self._held)
                    return Grant(None, PEER_SHARE if peers > 1 and mine >= self.capacity // peers else BUSY)
                self._remove(victim)
            slot = Slot(peer, state, now, on_evict)
            if victim is not None and victim.peer.key == peer.key:  # cycling its own slots refreshes nothing
                slot.origin = min(now, victim.since if victim.origin is None else victim.origin)
            self._add(slot)
        if victim is not None and victim.on_evict is not None:
            victim.on_evict(victim.evicted or EVICTED_IDLE)
        return Grant(slot, None, victim.evicted if victim is not None else None)

    def _victim(self, key: str, now: float) -> Slot | None:
        """The slot to take for a newcomer of ``key``: from the peers holding more than it, furthest above its
        fair share first, then from its own; in each, the longest idle, then the slowest body."""
        mine = len(self._held.get(key, ()))
        others = sorted((k for k, s in self._held.items() if k != key and len(s) > mine + 1),
                        key=lambda k: -len(self._held[k]))
        for k in (*others, key):
            slot = self._takeable(self._held.get(k), now)
            if slot is not None:
                return slot
        return None

    def _takeable(self, slots: dict[Slot, None] | None, now: float) -> Slot | None:
        """An idle, else the slowest, slot past the grace on its own time; else one past it only by the age
        it took over (a connection just opened in place of its peer's goes last: it may be an honest one that
        has not sent its request yet)."""
        if not slots:
            return None
        return self._scan(slots, now, False) or self._scan(slots, now, True)

    def _scan(self, slots: dict[Slot, None], now: float, inherited: bool) -> Slot | None:
        slowest: Slot | None = None
        slowest_rate = self.min_rate
        for s in slots:  # oldest first
            if inherited and s.origin is None:
                continue
            if now - (s.origin if inherited else s.since) < self.grace:
                continue
            if s.state == IDLE:
                s.evicted = EVICTED_IDLE
                return s
            age = now - s.since
            if s.state == RECEIVING and self.min_rate > 0 and age > 0:  # a body with no time yet is not slow
                rate = s.received / age
                if rate < slowest_rate:
                    slowest, slowest_rate = s, rate
        if slowest is not None:
            slowest.evicted = EVICTED_SLOW
        return slowest

    def _add(self, slot: Slot) -> None:
        self._total += 1
        if not slot.peer.trusted:
            self._held.setdefault(slot.peer.key, {})[slot] = None

    def _remove(self, slot: Slot) -> None:
        self._total -= 1
        slot.released = True
        if slot.peer.trusted:
            return
        slots = self._held.get(slot.peer.key)
        if slots is not None:
            slots.pop(slot, None)
            if not slots:
                del self._held[slot.peer.key]

    def release(self, slot: Slot | None) -> None:
        """Give a slot back (a no-op for one already taken or released)."""
        if slot is None:
            return
        with self._lock:
            if not slot.released:
                self._remove(slot)

    def mark(self, slot: Slot, state: str) -> bool:
        """``slot`` is now ``state`` (from now on the clock); False when it was taken meanwhile."""
        with self._lock:
            if slot.released:
                return False
            if state == IDLE and slot.state == LIVE:
                slot.origin = None  # a request was served: the slot's grace starts afresh
            slot.state, slot.since, slot.received = state, self._clock(), 0
            return True

    def bind(self, slot: Slot, peer: Peer) -> bool:
        """Charge a held slot to ``peer`` (a connection's tenant, once its token is checked); False when taken."""
        with self._lock:
            if slot.released:
                return False
            if slot.peer.key != peer.key or slot.peer.trusted != peer.trusted:
                self._remove(slot)
                slot.released = False
                slot.peer = peer
                self._add(slot)
            return True

    @property
    def in_use(self) -> int:
        return self._total

    def held_by(self, peer: Peer) -> int:
        """Slots ``peer`` holds now (tests and logs)."""
        return len(self._held.get(peer.key, ()))

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
