"""Which webhook URLs the service will POST to: http(s), no credentials, and a host that resolves to
public addresses only, so that a webhook cannot reach the service's own network (its database,
its cloud's metadata endpoint, a neighbour's admin port) unless the deployment allows it
(TRAINHUB_WEBHOOK_ALLOW_PRIVATE). Checked at submission and again at every delivery (DNS can
change between the two); a delivery connects to the very address that was checked."""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import httpx

from trainers.spec import MAX_WEBHOOK_URL_CHARS

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

ALLOW_SETTING = "TRAINHUB_WEBHOOK_ALLOW_PRIVATE"
EXAMPLE = "https://example.com/hooks/trainhub"


class RefusedUrl(ValueError):
    """The URL may not be used as a webhook; the message says why and what to do."""


@dataclass(frozen=True)
class Target:
    """A checked webhook URL: `url` as given, `address` the checked address to connect to."""

    url: httpx.URL
    address: Address

    def pinned(self) -> tuple[httpx.URL, dict[str, str], dict[str, str]]:
        """(URL with the address as its host, the Host header, httpx extensions): the request goes to
        the address that was checked, not to whatever the name resolves to a moment later, while
        the Host header and TLS (SNI, certificate check) still use the name."""
        url = self.url.copy_with(host=str(self.address))
        name = f"[{self.url.host}]" if ":" in self.url.host else self.url.host  # an IPv6 literal
        header = name if self.url.port is None else f"{name}:{self.url.port}"
        return url, {"Host": header}, {"sni_hostname": self.url.host}


def is_refused(address: Address) -> bool:
    """Whether `address` is one a webhook may not reach by default: loopback, link-local, private,
    shared (carrier-grade NAT), reserved, multicast, unspecified or otherwise not global; an
    IPv6 form of an IPv4 address is judged as that address."""
    if isinstance(address, ipaddress.IPv6Address) and (mapped := address.ipv4_mapped or address.sixtofour):
        return is_refused(mapped)
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_reserved
        or address.is_multicast
        or address.is_unspecified
        or not address.is_global
    )


def parse(url: str) -> httpx.URL:
    """`url` parsed; RefusedUrl when it is not an http(s) URL with a host, or holds credentials."""
    if len(url) > MAX_WEBHOOK_URL_CHARS:
        raise RefusedUrl(f"webhook_url is longer than {MAX_WEBHOOK_URL_CHARS} characters")
    if not url.isascii() or any(ch.isspace() or ord(ch) < 32 or ord(ch) == 127 for ch in url):
        raise RefusedUrl("webhook_url may not contain spaces, control or non-ASCII characters; percent-encode them")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise RefusedUrl(f"webhook_url is not a valid URL ({exc}); give e.g. {EXAMPLE}") from None
    if parsed.scheme not in ("http", "https"):
        raise RefusedUrl("webhook_url must start with https:// (or http://)")
    if not parsed.host:
        raise RefusedUrl(f"webhook_url has no host; give e.g. {EXAMPLE}")
    if parsed.userinfo:
        raise RefusedUrl(
            "webhook_url may not hold credentials (user:password@); deliveries are signed "
            "(Trainhub-Signature) so the receiver can check where they come from"
        )
    return parsed


def resolve(parsed: httpx.URL) -> list[Address]:
    """The addresses `parsed`'s host stands for (an IP literal: itself); RefusedUrl when it
    resolves to none."""
    try:
        return [ipaddress.ip_address(parsed.host)]
    except ValueError:
        pass
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(parsed.host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise RefusedUrl(f"webhook_url's host {parsed.host[:100]} does not resolve ({exc})") from None
    found: list[Address] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])  # an IPv6 zone is not part of it
        if address not in found:
            found.append(address)
    if not found:
        raise RefusedUrl(f"webhook_url's host {parsed.host[:100]} does not resolve")
    return found


def check(url: str, allow_private: bool) -> Target:
    """The Target to POST to for `url`. Raises RefusedUrl (its message names the fix) when the URL
    is malformed, or any address its host resolves to is refused (is_refused) and `allow_private`
    is false: one private address among public ones is enough for a name to reach inside."""
    parsed = parse(url)
    addresses = resolve(parsed)
    if not allow_private:
        for address in addresses:
            if is_refused(address):
                literal = str(address) == parsed.host
                where = f"{address} is" if literal else f"{parsed.host[:100]} resolves to {address},"
                raise RefusedUrl(
                    f"webhook_url's host {where} a loopback, link-local, private or "
                    f"reserved address, which this server does not send webhooks to; use a public URL (a "
                    f"deployment whose receivers are on its own network sets {ALLOW_SETTING}=1)"
                )
    return Target(parsed, addresses[0])
