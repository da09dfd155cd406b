# SPDX-License-Identifier: Apache-2.0
"""Weight sync from Python: rlpt::sync::sender / receiver over the shared-memory, TCP or UCX transport,
for torch tensors. A trainer publishes versions of its parameters; an inference process polls
and gets each version only once all of it arrived and was verified (XXH3 per bucket and per
tensor). A failed or interrupted update (a killed sender, a timeout, a corrupt bucket) leaves
the receiver on its last complete version and poll() says why.

    # trainer                                         # inference worker
    tx = rlpt.sync.Sender(model.state_dict(),          rx = rlpt.sync.Receiver("shm", "policy")
                          "shm", "policy")             u = rx.poll(wait=0.1)
    tx.publish(step)                                   if u["state"] == "published":
                                                           rx.load_into(model)

Transports: "shm" (address: a segment name, /dev/shm/<name>; the sender creates it), "tcp"
(address "host:port"; one side listens, ``listen=True``, port 0 picks a free one: ``port``) and
"ucx" (the same addresses, over UCX: RDMA where the NIC has it, shared memory or TCP otherwise;
where the package was built with UCX: ``rlpt._C.SYNC_UCX``). UCX's state does not survive a
fork: create a UCX Sender or Receiver in the process that uses it (multiprocessing "spawn").

Across machines, TCP and UCX authenticate both ends with the job's secret (``secret=``, str or bytes of
at least 16 bytes, the same on every end; e.g. ``os.environ["RLPT_SYNC_SECRET"]``): a peer
without it is refused, and every frame is tagged (AES-256-GMAC) so that nothing altered in flight
is published. ``integrity="full"`` (default) tags every byte, ``"control"`` only manifests,
checksums and commits. A non-loopback address without a secret raises rlpt.sync.insecure unless
``allow_unauthenticated=True`` (only on a network where every host is trusted). A TCP peer whose
host acknowledges nothing for ``max(timeout, 30)`` seconds (gone, or not reading) loses its
connection, which is made again on the next call (``tcp_options::dead_peer_timeout``). See
docs/sync.md.
Device tensors are staged through host copies on the sender; the receiver keeps a host mirror.
"""
import torch

from . import _C
from ._errors import call


def _security(secret, integrity, allow_unauthenticated):
    if isinstance(secret, str):
        secret = secret.encode()
    return _C.LinkSecurity(bytes(secret or b""), str(integrity), bool(allow_unauthenticated))


def _items(tensors):
    items = tensors.items() if hasattr(tensors, "items") else tensors
    return [(str(k), v) for k, v in items]


def capture_environment(variables=None, devices=None):
    """What this process runs with, for a preflight (docs/sync.md, "Preflight"): rlpt's version, the
    wire protocol, host, boot id, pid, ``variables`` (default: NCCL's parity set, NCCL_CUMEM_ENABLE
    and the transport, protocol and buffer settings), the CUDA ``devices`` this end moves weights
    with (indices, or torch.device; their UUIDs from torch) and torch's NCCL and CUDA versions.
    A dict; ship it to the peer with encode_environment / decode_environment over your own channel
    (an engine RPC), then compare_environments or require_parity."""
    env = call(_C.capture_environment, None if variables is None else [str(v) for v in variables])
    if devices:
        for d in devices:
            index = torch.device("cuda", d).index if isinstance(d, int) else torch.device(d).index
            env["devices"].append(("GPU-" + str(torch.cuda.get_device_properties(index).uuid), int(index)))
        if hasattr(torch.cuda, "nccl"):
            env["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        env["cuda_runtime"] = torch.version.cuda or ""
    return env


def compare_environments(ours, theirs, rules="nccl"):
    """The mismatches between two environments under ``rules``: "nccl" (versions, no GPU on both ends,
    one NCCL version, the NCCL parity variables), "same_host" (versions, one machine) or "version".
    A list of {"field", "ours", "theirs", "why"}."""
    return call(_C.compare_environments, ours, theirs, str(rules))


def require_parity(ours, theirs, rules="nccl", peer="the peer"):
    """Raises rlpt.Error (rlpt.sync.preflight) listing every mismatch, naming ``peer``."""
    call(_C.require_parity, ours, theirs, str(rules), str(peer))


def encode_environment(env):
    """An environment as bytes (rlpt's bounded, versioned wire form)."""
    return call(_C.encode_environment, env)


def decode_environment(data):
    """The environment in ``data`` (rlpt.sync.wire for anything malformed)."""
    return call(_C.decode_environment, bytes(data))


def quantize_fp8_blockwise(weight, block_size=128):
    """Block-wise FP8 quantize-on-send, bit for bit verl's ``scaled_fp8_blockwise``: a 2-D CPU
    weight (bfloat16, float16 or float32; quantize the bf16 values the trainer exports, not the fp32
    master) -> (codes float8_e4m3fn, same shape; scale_inv float32 [ceil(rows / b), ceil(cols / b)]),
    per block: scale = 448 / max|w| (1 for an all-zero block), codes = e4m3(clamp(w * scale, +-448)),
    scale_inv = 1 / scale. Ship them as ``name`` and ``name + "_scale_inv"``, as verl does."""
    return call(_C.quantize_fp8_blockwise, weight, int(block_size))


def audit_fp8_blockwise(weight, q, scale_inv, block_size=128):
    """Whether (q, scale_inv) is exactly quantize_fp8_blockwise(weight): {"ok", "blocks", "bad_scales",
    "bad_codes", "first": (row, col) of the first difference or None}."""
    return call(_C.audit_fp8_blockwise, weight, q, scale_inv, int(block_size))


class Sender:
    """Publishes versions of ``tensors`` (a state_dict or (name, tensor) pairs). CPU contiguous
    tensors are read in place at each publish(): keep them alive and do not modify them during a
    publish. Other tensors are copied into host staging buffers at each publish()."""

    def __init__(self, tensors, transport="shm", address="rlpt-weights", listen=False, bucket_bytes=64 << 20,
                 delta=False, timeout=30.0, secret=None, integrity="full", allow_unauthenticated=False):
        self._sources = []
        host = []
        for name, t in _items(tensors):
            t = t.detach()
            if t.device.type == "cpu" and t.is_contiguous():
                host.append((name, t))
            else:
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.is_cuda and torch.cuda.is_available())
                self._sources.append((t, buf))
                host.append((name, buf))
        self._host = host
        self._impl = call(_C.SyncSender, transport, address, bool(listen), host, int(bucket_bytes), 0, bool(delta),
                          float(timeout), _security(secret, integrity, allow_unauthenticated))

    def publish(self, version):
        """Sends ``version`` (increasing) and waits until the receiver published it. Returns a dict
        (version, delta, wire_bytes, digest, seconds, ...); raises rlpt.Error on refusal, timeout or
        a lost receiver (the previous version stays published there)."""
        for src, buf in self._sources:
            buf.copy_(src, non_blocking=False)
        return call(self._impl.publish, int(version))

    @property
    def version(self):
        return self._impl.published_version()

    @property
    def port(self):
        return self._impl.port()


class Receiver:
    """Takes versions from a Sender. ``on_tensor(name, tensor)`` (optional) is called for every
    tensor of a version once it is verified, with a view valid during the call (copy what you keep).

    ``targets`` (optional): {name: CPU contiguous tensor} that the receiver writes in place (the
    engine's parameters; dtype and shape as sent); the other tensors go to ``on_tensor``. Staged
    (the default), targets change only once the whole version verified. ``streaming=True`` with
    ``mirror=False`` copies each piece straight from the link into its target as it is verified
    (one pass over memory); a failed update then leaves the targets partly written (``partial``)
    until the next, dense one. Without a mirror, ``tensor``/``state_dict``/``verify`` and delta
    updates are unavailable.

    ``cache`` says what each published version asks of the engine's prefix (KV) cache: "none"
    (default), "reset" (drop every cached prefix before serving under the new weights: vLLM's
    ``reset_prefix_cache()``, SGLang's ``flush_cache``) or "salt" (key requests by the update's
    salt: vLLM's ``cache_salt``, SGLang's ``extra_key``). poll()'s update then carries
    ``update["cache"]`` = {"action", "version", "salt"}, pending until the engine calls
    ``acknowledge_cache(version)``; an update whose predecessor's directive was never acknowledged
    says so in ``update["cache_unacknowledged"]`` (its version; 0: none)."""

    def __init__(self, transport="shm", address="rlpt-weights", listen=False, timeout=30.0, on_tensor=None,
                 secret=None, integrity="full", allow_unauthenticated=False, targets=None, streaming=False,
                 mirror=True, cache="none"):
        self._impl = call(_C.SyncReceiver, transport, address, bool(listen), float(timeout), on_tensor,
                          _security(secret, integrity, allow_unauthenticated), list((targets or {}).items()),
                          bool(streaming), bool(mirror), str(cache))

    def poll(self, wait=0.0):
        """Processes messages for up to ``wait`` seconds (an update in progress is driven to its end).
        Returns {"state": "idle" | "published" | "failed", "version", "error_id", "reason", ...}."""
        return call(self._impl.poll, float(wait))

    @property
    def has_version(self):
        return self._impl.has_version()

    @property
    def pending_cache(self):
        """The latest version's cache directive while unacknowledged (a dict), else None."""
        return self._impl.pending_cache()

    def acknowledge_cache(self, version):
        """The engine applied the cache directive of ``version`` (rlpt.sync.bad_version unless it is
        the pending one). Call it from the thread that polls."""
        return call(self._impl.acknowledge_cache, int(version))

    @property
    def version(self):
        """The last complete version (None before the first)."""
        return self._impl.version() if self._impl.has_version() else None

    @property
    def port(self):
        return self._impl.port()

    def digest(self):
        return call(self._impl.digest)

    def verify(self):
        """Re-hashes the mirror against the published checksums (rlpt.sync.checksum on damage)."""
        return call(self._impl.verify)

    def tensor(self, name):
        """A copy of tensor ``name`` of the published version."""
        return call(self._impl.tensor, name)

    def state_dict(self):
        return {n: self.tensor(n) for n in call(self._impl.names)}

    @torch.no_grad()
    def load_into(self, module, strict=True):
        """Copies the published version into ``module``'s parameters and buffers (any device)."""
        return module.load_state_dict(self.state_dict(), strict=strict)
