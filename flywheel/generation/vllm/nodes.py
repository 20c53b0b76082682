"""Where the vLLM servers of a run on several nodes must listen (docs/scaling.md).

Global rank 0 launches the servers, pushes every weight sync and runs the probe after it;
every rank sends its search requests to every server. On one node that is all loopback. On
several, a launched server listens on 127.0.0.1 of rank 0's node, where the other nodes cannot
reach it, and an attached server given by a loopback URL is a different server on each node,
of which the sync and the probe reach only rank 0's own: the others keep sampling from the
weights they started with, unchecked. Both are refused before the run starts.
"""

from __future__ import annotations

import ipaddress
from typing import Sequence
from urllib.parse import urlsplit

URL_FLAG = "--data.generator.init_args.url"


def is_loopback(url: str) -> bool:
    """The URL names this machine only (localhost, 127.0.0.0/8, ::1)."""
    host = urlsplit(url if "://" in url else f"http://{url}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: resolved on each node, assumed to name one machine
        return False


def node_refusal(urls: Sequence[str], num_nodes: int) -> str | None:
    """Why these servers cannot serve a run on `num_nodes` nodes (no `urls`: launched by the
    sidecar), or None."""
    if num_nodes <= 1:
        return None
    fix = (f"start a vLLM server on each node (or a separate pool) listening on an address every node reaches, and "
           f"pass them all, e.g. {URL_FLAG}=[http://node0:8000,http://node1:8000] (docs/scaling.md)")
    if not urls:
        return (f"--trainer.num_nodes={num_nodes} with launched vLLM servers: they listen on 127.0.0.1 of global rank "
                f"0's node, which the ranks of the other nodes cannot reach; {fix}")
    loopback = [u for u in urls if is_loopback(u)]
    if loopback:
        return (f"--trainer.num_nodes={num_nodes} with the vLLM server {loopback[0]} ({URL_FLAG}): a loopback address "
                "is a different server on each node, and the weight sync and its probe, sent from global rank 0, "
                f"reach only rank 0's, so the other nodes would search with stale weights; {fix}")
    return None
