"""Running the application on uvicorn: bind first (so that the address printed is the one served,
port 0 included), then serve until Ctrl-C."""

import ipaddress
import socket
from dataclasses import dataclass

from longdoc.errors import InputError

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def allowed_hosts(host: str) -> tuple[str, ...]:
    """The Host headers to answer: the loopback names when bound to loopback (a web page whose DNS
    name was rebound to 127.0.0.1 sends its own name, and is refused), any otherwise."""
    return LOOPBACK_NAMES if is_loopback(host) else ("*",)


@dataclass
class Listener:
    socket: socket.socket
    url: str


def listen(host: str, port: int) -> Listener:
    """A socket bound to host:port, listening; InputError when the address cannot be used."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, protocol)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        raise InputError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if family == socket.AF_INET6 else bound_host
    return Listener(sock, f"http://{shown}:{bound_port}/")


def run(app, listener: Listener, log_level: str = "warning") -> None:
    """Serve `app` on the listener's socket until interrupted (Ctrl-C, SIGTERM)."""
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, access_log=log_level == "info", timeout_graceful_shutdown=2)
    try:
        uvicorn.Server(config).run(sockets=[listener.socket])
    except KeyboardInterrupt:
        # uvicorn shuts down gracefully, then raises the signal again for the caller: here, the end.
        pass
