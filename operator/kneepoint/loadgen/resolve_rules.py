"""``--resolve HOST:PORT:ADDR`` rules, as curl's: connect to ADDR when a URL names HOST:PORT.

The sandbox runner sets ``KNEEPOINT_RESOLVE`` so that Service DNS names in the load-test
Job's command reach pods on loopback addresses without a DNS server. Parsing is pure; the
aiohttp resolver that applies the rules lives in ``http_client``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

ENV_VAR = "KNEEPOINT_RESOLVE"


class ResolveRuleError(ValueError):
    """A rule that is not HOST:PORT:ADDR; the message names the rule and the expected form."""


def parse_resolve_rule(rule: str) -> tuple[tuple[str, int], str]:
    """``"HOST:PORT:ADDR"`` -> ((host lower-cased, port), addr). ADDR may be IPv6, bracketed or not."""
    text = rule.strip()
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise ResolveRuleError(f"--resolve {rule!r}: expected HOST:PORT:ADDR")
        host, rest = text[1:close], text[close + 2 :]
    else:
        host, _, rest = text.partition(":")
    port_text, colon, address = rest.partition(":")
    if not host or not colon or not address:
        raise ResolveRuleError(f"--resolve {rule!r}: expected HOST:PORT:ADDR")
    try:
        port = int(port_text)
    except ValueError:
        raise ResolveRuleError(f"--resolve {rule!r}: PORT must be an integer 1-65535") from None
    if not 1 <= port <= 65535:
        raise ResolveRuleError(f"--resolve {rule!r}: PORT must be an integer 1-65535")
    address = address.strip("[]")
    try:
        ipaddress.ip_address(address)
    except ValueError:
        raise ResolveRuleError(f"--resolve {rule!r}: ADDR must be an IP address, got {address!r}") from None
    return (host.lower(), port), address


def parse_resolve_rules(flag_values: Iterable[str], env_value: str | None) -> dict[tuple[str, int], str]:
    """All rules from the flag (repeatable) and the comma-separated env; the flag wins."""
    rules: dict[tuple[str, int], str] = {}
    for entry in (env_value or "").split(","):
        if entry.strip():
            key, address = parse_resolve_rule(entry)
            rules[key] = address
    for entry in flag_values:
        key, address = parse_resolve_rule(entry)
        rules[key] = address
    return rules
