"""Where the boards are: a static list of targets plus DNS names re-resolved periodically.

A DNS name with several A/AAAA records stands for several boards on one port (a Kubernetes
headless service works unchanged): each address becomes a TCP target `ip:port`. `Discovery`
produces the full set of targets each round; the `Fleet` adds boards that appeared and removes
those that vanished. A failed lookup keeps the name's previous addresses (a DNS hiccup must not
empty the fleet). The resolver is an ABC: the system's (getaddrinfo), or a hosts-format file
re-read every round (`--dns-hosts-file`).
"""

from __future__ import annotations

import abc
import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable
from pathlib import Path

from calculet.common.errors import InvalidArgument

log = logging.getLogger("calculet.gateway.discovery")


class Resolver(abc.ABC):
    @abc.abstractmethod
    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses of `host` (IPv4 dotted or IPv6 text), in a stable order.

        Raises:
            OSError: the lookup failed.
        """


class SystemResolver(Resolver):
    """The system's resolver (getaddrinfo in the loop's executor)."""

    async def resolve(self, host: str, port: int) -> list[str]:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        return sorted({str(info[4][0]) for info in infos})


class HostsFileResolver(Resolver):
    """Names from a hosts-format file (`ADDRESS NAME [NAME...]` lines, `#` comments), re-read on
    every lookup: for fleets whose board list is written by configuration management rather than
    served by DNS (and for tests, which change the file to add or remove a board).

    Args:
        path: the file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    async def resolve(self, host: str, port: int) -> list[str]:
        text = await asyncio.to_thread(self.path.read_text, encoding="utf-8")
        found = set()
        for line in text.splitlines():
            fields = line.split("#", 1)[0].split()
            if len(fields) >= 2 and host in fields[1:]:
                try:
                    found.add(str(ipaddress.ip_address(fields[0])))
                except ValueError:
                    log.warning("hosts file %s: ignoring bad address %r", self.path, fields[0])
        return sorted(found)


def split_host_port(text: str) -> tuple[str, int]:
    """`name:port` -> (name, port).

    Raises:
        InvalidArgument: no port, or a port outside 1..65535.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise InvalidArgument(f"dns {text!r}: expected NAME:PORT")
    return host.strip("[]"), int(port)


def tcp_target(address: str, port: int) -> str:
    ip = ipaddress.ip_address(address)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


class Discovery:
    """Static targets + DNS names.

    Args:
        static: daemon targets as given (`unix:PATH`, `host:port`).
        dns_names: `NAME:PORT` entries.
        resolver: the lookup (system's by default).
    """

    def __init__(self, static: Iterable[str], dns_names: Iterable[str], resolver: Resolver | None = None) -> None:
        self.static = tuple(dict.fromkeys(static))
        self.dns = tuple(split_host_port(name) for name in dict.fromkeys(dns_names))
        self._resolver = resolver or SystemResolver()
        self._last: dict[tuple[str, int], list[str]] = {}

    async def targets(self) -> list[str]:
        """Every target now (static first, then each name's addresses)."""
        found = list(self.static)
        for host, port in self.dns:
            try:
                addresses = await self._resolver.resolve(host, port)
                self._last[(host, port)] = addresses
            except OSError as err:
                addresses = self._last.get((host, port), [])
                log.warning(
                    "dns %s:%d: lookup failed (%s); keeping %d known addresses", host, port, err, len(addresses)
                )
            found.extend(tcp_target(a, port) for a in addresses)
        return list(dict.fromkeys(found))
