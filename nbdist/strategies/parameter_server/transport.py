"""Tensors between a ps task and its clients (workers, the chief): gloo point-to-point.

Each client forms a two-rank gloo group with each ps task it talks to, through the ps task's
`TCPStore`: the client takes a session number (`store.add`), announces it, and both sides
create the group under the prefix `nbdist/ps/s<number>/`, so a worker that comes back forms a
new pair without disturbing the others. A message is one fixed-size slot (the length of the
pickled header, and the header itself when it fits: one small send for most requests, the
pickled header on its own when longer) followed by its tensors: those up to 256 KiB copied
together into one buffer (one gloo operation, not one each: each costs ~0.3 ms of CPU here),
larger ones each sent whole on its own tag, all in flight at once. The ps acts on a message
only once all of it has arrived.

Example (both sides in one process)::

    server = PSTask("127.0.0.1", 0).start()
    client = PSClient(0, f"127.0.0.1:{server.port}")
    client.create({7: torch.zeros(3)}); client.add({7: torch.ones(3)}); client.read([7])
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import math
import pickle
import socket
import threading
import weakref
from typing import Any

import torch
import torch.distributed as dist

from nbdist._private_api import gloo_options
from nbdist.errors import PSUnavailableError

__all__ = ["PSClient", "Pair", "close_clients", "connect_store", "form_pair", "split_address"]

SESSIONS = "nbdist/ps/sessions"
_ANNOUNCE = "nbdist/ps/req/"
_SLOT = 512  # bytes of the first message of every request and answer
_PACK_MAX = 256 << 10  # tensors up to this size travel together, copied into one buffer
_ALIGN = 64


def split_address(address: str) -> tuple[str, int]:
    """`"host:port"` → `(host, port)`."""
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def connect_store(address: str, timeout: float) -> dist.TCPStore:
    """A client of the ps task's store at `address`."""
    host, port = split_address(address)
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout))


def _options(host: str, timeout: float) -> Any:
    loopback = host.startswith("127.") or host == "localhost"
    address = None if loopback else _address_towards(host)
    return gloo_options(datetime.timedelta(seconds=timeout), loopback, address)


def _address_towards(host: str) -> str | None:
    """This machine's IPv4 address on the route to `host` (the ps task's own address on the
    ps side); None when `host` does not resolve or no route leads there.

    Note [A pair on the route's address]: gloo's default device binds to what this machine's
    own name resolves to: on Debian often 127.0.1.1, which no other host reaches, so a ps
    task and its clients on different hosts never formed a pair. The pair uses the address
    the route to the ps leaves from instead (asking the routing table sends no packet; a
    UDP socket's `connect`). `GLOO_SOCKET_IFNAME`, when set, still picks the interface.
    """
    try:
        target = socket.gethostbyname(host)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((target, 9))
        except OSError:
            return None
        return str(probe.getsockname()[0])


def form_pair(store: Any, session: int, rank: int, host: str, timeout: float) -> Pair:
    """The two-rank gloo group of `session` (rank 0 is the ps task)."""
    prefixed = dist.PrefixStore(f"nbdist/ps/s{session}/", store)
    return Pair(dist.ProcessGroupGloo(prefixed, rank, 2, _options(host, timeout)), 1 - rank)


class Pair:
    """One end of a two-rank gloo group: send and receive whole messages."""

    def __init__(self, group: Any, peer: int):
        self._group = group
        self._peer = peer

    def send(self, header: Any, tensors: list[torch.Tensor] = ()) -> None:
        """Send `header` (picklable, no tensors) and then `tensors`."""
        tensors = [t.detach().contiguous() for t in tensors]
        specs = [(tuple(t.shape), t.dtype) for t in tensors]
        data = pickle.dumps((header, specs), protocol=pickle.HIGHEST_PROTOCOL)
        slot = bytearray(_SLOT)  # one small message: the length, and the header if it fits
        slot[:8] = len(data).to_bytes(8, "little")
        inline = len(data) <= _SLOT - 8
        if inline:
            slot[8 : 8 + len(data)] = data
        works = [self._group.send([torch.frombuffer(slot, dtype=torch.uint8)], self._peer, 0)]
        if not inline:
            body = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            works.append(self._group.send([body], self._peer, 1))
        offsets, size = _layout(specs)
        if size:  # the small tensors in one buffer: one gloo operation instead of one each
            pack = torch.empty(size, dtype=torch.uint8)
            for tensor, offset in zip(tensors, offsets):
                if offset is not None:
                    flat = tensor.reshape(-1).view(torch.uint8)
                    pack[offset : offset + flat.numel()].copy_(flat)
            works.append(self._group.send([pack], self._peer, 2))
        # All sends in flight at once, each large tensor on its own tag (matched one to one).
        works += [
            self._group.send([tensor], self._peer, 3 + i)
            for i, tensor in enumerate(tensors)
            if offsets[i] is None and tensor.numel()
        ]
        for work in works:
            work.wait()

    def recv(self, into: Any = ()) -> tuple[Any, list[torch.Tensor]]:
        """The next message: `(header, tensors)`, all of it.

        `into`: tensors (or None) to receive the message's tensors into, in order; one of the
        wrong shape, dtype or layout is left alone and a new tensor received instead.
        """
        slot = torch.empty(_SLOT, dtype=torch.uint8)
        self._group.recv([slot], self._peer, 0).wait()
        raw = slot.numpy().tobytes()
        size = int.from_bytes(raw[:8], "little")
        if size <= _SLOT - 8:
            data = raw[8 : 8 + size]
        else:
            body = torch.empty(size, dtype=torch.uint8)
            self._group.recv([body], self._peer, 1).wait()
            data = body.numpy().tobytes()
        header, specs = pickle.loads(data)
        into = list(into)
        tensors = [
            _reuse(into[i] if i < len(into) else None, shape, dtype)
            for i, (shape, dtype) in enumerate(specs)
        ]
        offsets, size = _layout(specs)
        works = []
        pack = None
        if size:
            pack = torch.empty(size, dtype=torch.uint8)
            works.append(self._group.recv([pack], self._peer, 2))
        works += [
            self._group.recv([tensor], self._peer, 3 + i)
            for i, tensor in enumerate(tensors)
            if offsets[i] is None and tensor.numel()
        ]
        for work in works:
            work.wait()
        for tensor, offset in zip(tensors, offsets):
            if offset is not None:
                flat = tensor.reshape(-1).view(torch.uint8)
                flat.copy_(pack[offset : offset + flat.numel()])
        return header, tensors


def _layout(specs: list[tuple[tuple[int, ...], torch.dtype]]) -> tuple[list[int | None], int]:
    """Where each tensor of a message goes in its pack of small tensors (None: a tensor of
    more than `_PACK_MAX` bytes, or empty, sent on its own), and the pack's size. Both ends
    compute it from the header."""
    offsets: list[int | None] = []
    size = 0
    for shape, dtype in specs:
        nbytes = math.prod(shape) * dtype.itemsize
        if 0 < nbytes <= _PACK_MAX:
            offsets.append(size)
            size += -(-nbytes // _ALIGN) * _ALIGN
        else:
            offsets.append(None)
    return offsets, size


def _reuse(tensor: Any, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    if (
        isinstance(tensor, torch.Tensor)
        and tuple(tensor.shape) == tuple(shape)
        and tensor.dtype == dtype
        and tensor.is_contiguous()
        and tensor.device.type == "cpu"
    ):
        return tensor
    return torch.empty(shape, dtype=dtype)


class PSClient:
    """This process's connection to ps task `index` at `address` (thread-safe).

    Every failure to reach the ps is a `PSUnavailableError` naming it; the connection is then
    dropped and formed again on the next request (a restarted ps task is found again).
    """

    def __init__(self, index: int, address: str, timeout: float = 300.0):
        self.index = index
        self.address = address
        self._timeout = timeout
        self._lock = threading.Lock()
        self._pair: Pair | None = None
        self._store: Any = None
        _clients.add(self)

    def _unavailable(self, error: BaseException) -> PSUnavailableError:
        return PSUnavailableError(
            f"Parameter server /job:ps/task:{self.index} at {self.address} is unavailable "
            f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). Its "
            "variables are lost: restart the ps task and the training, restoring the variables "
            "from the last checkpoint (docs/parameter-server.md).",
            ps=self.index,
            address=self.address,
        )

    def _connect(self) -> Pair:
        if self._pair is None:
            host, _ = split_address(self.address)
            store = connect_store(self.address, min(self._timeout, 30.0))
            session = store.add(SESSIONS, 1)
            store.set(f"{_ANNOUNCE}{session}", b"1")
            self._pair = form_pair(store, session, 1, host, self._timeout)
            self._store = store
        return self._pair

    def request(
        self, header: Any, tensors: list[torch.Tensor] = (), into: Any = ()
    ) -> tuple[Any, list]:
        """Send one request and return the ps task's answer `(header, tensors)` (its tensors
        received into `into` where they fit, see `Pair.recv`)."""
        with self._lock:
            try:
                pair = self._connect()
                pair.send(header, tensors)
                answer, out = pair.recv(into)
            except Exception as error:
                self._pair = None
                self._store = None
                raise self._unavailable(error) from None
        if isinstance(answer, dict) and answer.get("error"):
            raise PSUnavailableError(
                f"Parameter server /job:ps/task:{self.index} at {self.address} refused a request: "
                f"{answer['error']}. A ps task that was restarted has lost its variables: restore "
                "them from the last checkpoint (docs/parameter-server.md).",
                ps=self.index,
                address=self.address,
            )
        return answer, out

    def create(self, values: dict[int, torch.Tensor]) -> None:
        """Create (or overwrite) variables `{id: value}` on the ps task."""
        ids = list(values)
        self.request(("assign", ids), [values[i].detach().cpu() for i in ids])

    def assign(self, values: dict[int, torch.Tensor]) -> None:
        """Overwrite variables `{id: value}`."""
        self.create(values)

    def add(self, deltas: dict[int, torch.Tensor]) -> None:
        """Add `{id: delta}` to the variables, all of them or none."""
        ids = list(deltas)
        self.request(("add", ids), [deltas[i].detach().cpu() for i in ids])

    def read(self, ids: list[int], into: Any = ()) -> list[torch.Tensor]:
        """The current values of variables `ids` (received into the tensors of `into` that
        have the right shape and dtype, new tensors otherwise)."""
        _, tensors = self.request(("read", list(ids)), into=into)
        return tensors

    def read_slots(self, keys: list[tuple[int, int]]) -> list[dict[str, torch.Tensor]]:
        """The optimizer slots kept for each `(shard id, optimizer id)`: name -> value
        (an empty dict where none exist yet)."""
        names, tensors = self.request(("slots_read", list(keys)))
        out, values = [], iter(tensors)
        for group in names:
            out.append({name: next(values) for name in group})
        return out

    def write_slots(self, entries: list[tuple[int, int, str, str]], tensors: list) -> None:
        """Update optimizer slots `(shard id, optimizer id, name, "add" | "init")`, all in
        one message (applied whole)."""
        self.request(("slots_write", list(entries)), [t.detach().cpu() for t in tensors])

    def ping(self) -> None:
        """Raise `PSUnavailableError` unless the ps task answers."""
        self.request(("ping", []))

    def close(self) -> None:
        """Say goodbye to the ps task (its thread for this client ends) and drop the pair."""
        with self._lock:
            if self._pair is not None:
                with contextlib.suppress(Exception):
                    self._pair.send(("bye", []))
            self._pair = None
            self._store = None


_clients: weakref.WeakSet[PSClient] = weakref.WeakSet()


@atexit.register
def close_clients() -> None:
    """Close every connection at exit, so no ps thread waits on a pair that is going away."""
    for client in list(_clients):
        with contextlib.suppress(Exception):
            client.close()
