"""Loopback pod addresses for the sandbox's pod runner.

Pure (standard library only). Each pod the runner runs gets its own address in a
loopback range (default ``127.2.0.0/16``; KWOK's ``--cidr`` for
pretend pods is ``127.1.0.0/16``, so the two never hand out the same address): Linux routes all of 127.0.0.0/8 to ``lo``, so a
process can bind to its pod's own address and two engines can both listen on port 8000,
as in a cluster where every pod has its own network namespace.

The pool hands out addresses round-robin rather than lowest-free, so an address freed by a
finished Job pod (whose status still names it) is reused only after the whole range has
gone round; Prometheus series and logs of old pods then never share an address with a
live pod in practice.
"""

from __future__ import annotations

import ipaddress

DEFAULT_POD_CIDR = "127.2.0.0/16"
_LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")


class PoolExhausted(RuntimeError):
    """Every address of the range is in use."""


def parse_loopback_cidr(cidr: str) -> ipaddress.IPv4Network:
    """The network ``cidr`` names, which must lie inside 127.0.0.0/8 and hold 2+ hosts.

    Raises ValueError with one line naming the value and what is allowed.
    """
    try:
        network = ipaddress.ip_network(cidr, strict=True)
    except ValueError as exc:
        raise ValueError(f"--pod-cidr {cidr!r}: not a network in CIDR form ({exc})") from None
    if not isinstance(network, ipaddress.IPv4Network) or not network.subnet_of(_LOOPBACK):
        raise ValueError(f"--pod-cidr {cidr!r}: must lie inside 127.0.0.0/8 (the sandbox uses loopback only)")
    if network.num_addresses < 4:
        raise ValueError(f"--pod-cidr {cidr!r}: needs at least 4 addresses (a /30 or wider)")
    return network


class LoopbackPool:
    """Allocates one address per key (a pod uid) from a loopback network.

    The network and broadcast addresses are never handed out. ``reserve`` records an
    address a pod already carries (after a runner restart) so it is not given twice.
    """

    def __init__(self, cidr: str = DEFAULT_POD_CIDR) -> None:
        self.network = parse_loopback_cidr(cidr)
        self._first = int(self.network.network_address) + 1
        self._last = int(self.network.broadcast_address) - 1
        self._next = self._first
        self._by_key: dict[str, int] = {}
        self._by_address: dict[int, str] = {}

    def __contains__(self, address: object) -> bool:
        """Whether ``address`` (a string) lies in this pool's network."""
        try:
            return ipaddress.ip_address(str(address)) in self.network
        except ValueError:
            return False

    def __len__(self) -> int:
        return len(self._by_key)

    def address_of(self, key: str) -> str | None:
        """The address held by ``key``, if any."""
        value = self._by_key.get(key)
        return None if value is None else str(ipaddress.ip_address(value))

    def allocate(self, key: str) -> str:
        """The address of ``key``: the one it holds, else the next free one round-robin."""
        held = self.address_of(key)
        if held is not None:
            return held
        size = self._last - self._first + 1
        for step in range(size):
            candidate = self._first + (self._next - self._first + step) % size
            if candidate not in self._by_address:
                self._take(key, candidate)
                self._next = candidate + 1 if candidate < self._last else self._first
                return str(ipaddress.ip_address(candidate))
        raise PoolExhausted(f"all {size} addresses of {self.network} are in use")

    def reserve(self, key: str, address: str) -> bool:
        """Record that ``key`` holds ``address``; False when it is outside the pool or taken."""
        if address not in self:
            return False
        value = int(ipaddress.ip_address(address))
        if not self._first <= value <= self._last:
            return False
        owner = self._by_address.get(value)
        if owner is not None:
            return owner == key
        self.release(key)
        self._take(key, value)
        return True

    def skip_past(self, address: str) -> None:
        """Continue round-robin after ``address`` if it lies beyond the current position.

        A restarted runner calls it with the addresses finished pods still show, so new
        pods do not get those addresses first.
        """
        if address not in self:
            return
        value = int(ipaddress.ip_address(address))
        if self._first <= value <= self._last and value >= self._next:
            self._next = value + 1 if value < self._last else self._first

    def release(self, key: str) -> None:
        """Free the address ``key`` holds (no-op when it holds none)."""
        value = self._by_key.pop(key, None)
        if value is not None:
            self._by_address.pop(value, None)

    def _take(self, key: str, value: int) -> None:
        self._by_key[key] = value
        self._by_address[value] = key
