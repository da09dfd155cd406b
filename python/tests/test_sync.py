# SPDX-License-Identifier: Apache-2.0
"""Weight sync between two Python processes over shared memory and TCP: several versions arrive
complete and verified; a sender killed in the middle of an update leaves the receiver on its last
complete version (and a new sender continues from there)."""
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
import torch

import rlpt.sync

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from sync_sender import params  # noqa: E402


def spawn(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, os.path.join(HERE, "sync_sender.py"), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def poll_until(rx, pred, seconds=60.0):
    seen = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        u = rx.poll(wait=0.05)
        if u["state"] != "idle":
            seen.append(u)
        if pred(seen):
            return seen
    raise AssertionError(f"timed out; updates seen: {seen}")


def check_version(rx, v, big=0):
    want = params(v, big)
    got = rx.state_dict()
    assert set(got) == set(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and torch.equal(got[k], want[k]), k
    rx.verify()


def lines_until(proc, prefix, out):
    for line in proc.stdout:
        out.append(line.strip())
        if line.startswith(prefix):
            return line
    raise AssertionError(f"sender exited: {out} {proc.stderr.read()}")


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_versions_then_killed_sender(transport):
    big = 32 << 20  # 128 MB: an update that takes a while (~100 ms over shm) through 1 MB buckets
    if transport == "shm":
        address = f"rlpt-test-{uuid.uuid4().hex[:12]}"
        rx = rlpt.sync.Receiver("shm", address, timeout=20.0)
        sender_address = address
    else:
        rx = rlpt.sync.Receiver("tcp", "127.0.0.1:0", listen=True, timeout=20.0)
        sender_address = f"127.0.0.1:{rx.port}"
    proc = spawn("--transport", transport, "--address", sender_address, "--versions", 3, "--hang-at", 4,
                 "--big", big)
    out = []
    try:
        seen = poll_until(rx, lambda s: len([u for u in s if u["state"] == "published"]) >= 3)
        assert [u["version"] for u in seen] == [1, 2, 3]
        assert all(u["state"] == "published" for u in seen)
        check_version(rx, 3, big)
        digest3 = rx.digest()
        # Kill the sender while it publishes version 4 (the receiver is polling in this thread).
        killer = threading.Thread(target=lambda: (lines_until(proc, "publishing 4", out), time.sleep(0.01),
                                                  proc.send_signal(signal.SIGKILL)))
        killer.start()
        updates = []
        until = time.monotonic() + 30
        while killer.is_alive() or (time.monotonic() < until and proc.poll() is None):
            u = rx.poll(wait=0.05)
            if u["state"] != "idle":
                updates.append(u)
        killer.join()
        proc.wait(timeout=10)
        for _ in range(10):  # anything still in flight ends as a failure, never as version 4
            u = rx.poll(wait=0.1)
            if u["state"] != "idle":
                updates.append(u)
        assert "finished" not in out
        assert all(u["state"] == "failed" and u["version"] == 4 for u in updates), updates
        assert rx.version == 3 and rx.digest() == digest3
        check_version(rx, 3, big)
        if transport == "shm":  # a restarted sender continues from there
            proc2 = spawn("--transport", "shm", "--address", sender_address, "--first", 5, "--versions", 1)
            seen = poll_until(rx, lambda s: any(u["state"] == "published" for u in s))
            assert seen[-1]["version"] == 5
            assert proc2.wait(timeout=30) == 0
            check_version(rx, 5)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_receiver_callback_and_errors():
    address = f"rlpt-test-{uuid.uuid4().hex[:12]}"
    got = {}
    rx = rlpt.sync.Receiver("shm", address, on_tensor=lambda n, t: got.__setitem__(n, t.clone()))
    proc = spawn("--transport", "shm", "--address", address, "--versions", 1)
    poll_until(rx, lambda s: any(u["state"] == "published" for u in s))
    assert proc.wait(timeout=30) == 0
    want = params(1, 0)
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(rlpt.Error) as e:
        rx.tensor("nope")
    assert e.value.id == "rlpt.sync.unknown_tensor"
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.Receiver("carrier-pigeon", "x")
    assert e.value.id == "rlpt.python.bad_option"


@pytest.mark.parametrize("cache", ["reset", "salt"])
def test_cache_directive_pending_until_acknowledged(cache):
    address = f"rlpt-test-{uuid.uuid4().hex[:12]}"
    rx = rlpt.sync.Receiver("shm", address, cache=cache)
    proc = spawn("--transport", "shm", "--address", address, "--versions", 3)
    seen = []
    while len(seen) < 3:  # acknowledge the first version's directive only
        u = rx.poll(wait=0.1)
        if u["state"] == "published":
            seen.append(u)
            if u["version"] == 1:
                assert rx.pending_cache == u["cache"]
                rx.acknowledge_cache(1)
                assert rx.pending_cache is None
        assert u["state"] != "failed", u
    assert proc.wait(timeout=30) == 0
    assert [u["cache"]["action"] for u in seen] == [cache] * 3
    assert [u["cache"]["version"] for u in seen] == [1, 2, 3]
    assert [u["cache_unacknowledged"] for u in seen] == [0, 0, 2]
    if cache == "salt":
        assert seen[2]["cache"]["salt"] == f"rlpt-v3-{seen[2]['digest']:016x}"
    with pytest.raises(rlpt.Error) as e:
        rx.acknowledge_cache(2)
    assert e.value.id == "rlpt.sync.bad_version" and "pending one is version 3's" in e.value.message
    rx.acknowledge_cache(3)
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.Receiver("shm", address + "x", cache="flush")
    assert e.value.id == "rlpt.python.bad_option"


@pytest.mark.parametrize("streaming,mirror", [(False, True), (True, True), (True, False)])
def test_receiver_writes_its_targets(streaming, mirror):
    address = f"rlpt-test-{uuid.uuid4().hex[:12]}"
    want = params(2, 0)
    names = sorted(want)
    targets = {n: torch.zeros_like(want[n]) for n in names[1:]}  # names[0] goes to on_tensor
    got = {}
    rx = rlpt.sync.Receiver("shm", address, targets=targets, streaming=streaming, mirror=mirror,
                            on_tensor=lambda n, t: got.__setitem__(n, t.clone()))
    proc = spawn("--transport", "shm", "--address", address, "--versions", 2)
    seen = poll_until(rx, lambda s: len([u for u in s if u["state"] == "published"]) >= 2)
    assert proc.wait(timeout=30) == 0
    assert [u["version"] for u in seen] == [1, 2]
    for n in names[1:]:
        assert torch.equal(targets[n], want[n]), n
    assert set(got) == {names[0]} and torch.equal(got[names[0]], want[names[0]])
    if mirror:
        check_version(rx, 2)
    bad = {names[1]: torch.zeros(2, 3).t()}  # not contiguous
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.Receiver("shm", address + "x", targets=bad)
    assert e.value.id == "rlpt.python.strides" and names[1] in str(e.value)


@pytest.mark.skipif(not rlpt._C.SYNC_AUTH, reason="rlpt built without OpenSSL (no authenticated TCP)")
def test_tcp_with_the_jobs_secret():
    secret = "0123456789abcdef0123456789abcdef"
    rx = rlpt.sync.Receiver("tcp", "127.0.0.1:0", listen=True, timeout=20.0, secret=secret)
    # A sender with another secret is refused; the receiver stays without a version.
    bad = spawn("--transport", "tcp", "--address", f"127.0.0.1:{rx.port}", "--versions", 1,
                "--secret", "another job's secret, 32 bytes.")
    while bad.poll() is None:
        rx.poll(wait=0.05)
    assert bad.returncode != 0 and "rlpt.sync.auth" in bad.stderr.read()
    assert not rx.has_version
    good = spawn("--transport", "tcp", "--address", f"127.0.0.1:{rx.port}", "--versions", 2, "--secret", secret)
    seen = poll_until(rx, lambda s: len([u for u in s if u["state"] == "published"]) >= 2)
    assert [u["version"] for u in seen if u["state"] == "published"] == [1, 2]
    assert good.wait(timeout=30) == 0
    check_version(rx, 2)
    # Across machines a secret is required unless explicitly waived.
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.Receiver("tcp", "0.0.0.0:0", listen=True)
    assert e.value.id == "rlpt.sync.insecure"
    rlpt.sync.Receiver("tcp", "0.0.0.0:0", listen=True, allow_unauthenticated=True)
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.Receiver("tcp", "127.0.0.1:0", listen=True, secret="short")
    assert e.value.id == "rlpt.sync.bad_link"
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.Receiver("tcp", "127.0.0.1:0", listen=True, secret=secret, integrity="most")
    assert e.value.id == "rlpt.python.bad_option"


@pytest.mark.skipif(not (rlpt._C.SYNC_UCX and rlpt._C.SYNC_AUTH), reason="rlpt built without UCX or OpenSSL")
def test_ucx_with_the_jobs_secret():
    secret = "0123456789abcdef0123456789abcdef"
    rx = rlpt.sync.Receiver("ucx", "127.0.0.1:0", listen=True, timeout=20.0, secret=secret)
    assert rx.port != 0
    # A sender with another secret is refused; the receiver stays without a version.
    bad = spawn("--transport", "ucx", "--address", f"127.0.0.1:{rx.port}", "--versions", 1,
                "--secret", "another job's secret, 32 bytes.")
    while bad.poll() is None:
        rx.poll(wait=0.05)
    assert bad.returncode != 0 and "rlpt.sync.auth" in bad.stderr.read()
    assert not rx.has_version
    good = spawn("--transport", "ucx", "--address", f"127.0.0.1:{rx.port}", "--versions", 3, "--secret", secret)
    seen = poll_until(rx, lambda s: len([u for u in s if u["state"] == "published"]) >= 3)
    assert [u["version"] for u in seen if u["state"] == "published"] == [1, 2, 3]
    assert good.wait(timeout=30) == 0
    check_version(rx, 3)
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.Receiver("ucx", "0.0.0.0:0", listen=True)
    assert e.value.id == "rlpt.sync.insecure"
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.Receiver("ucx", "127.0.0.1", listen=True)
    assert e.value.id == "rlpt.python.bad_option"


def test_inference_worker_example():
    example = os.path.join(HERE, "..", "examples", "inference_worker.py")
    r = subprocess.run([sys.executable, example, "--demo", "--address", f"rlpt-ex-{uuid.uuid4().hex[:12]}"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "worker: finished on version 3" in r.stdout


def test_preflight_environments(monkeypatch):
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "0")
    ours = rlpt.sync.capture_environment()
    assert ours["variables"]["NCCL_CUMEM_ENABLE"] == "0" and ours["pid"] == os.getpid()
    assert len(ours["machine"]) == 36
    theirs = rlpt.sync.decode_environment(rlpt.sync.encode_environment(ours))
    assert theirs == ours
    theirs["variables"]["NCCL_CUMEM_ENABLE"] = None  # the engine's workers run without it
    theirs["devices"] = [("GPU-0a1b2c3d-0000-1111-2222-333344445555", 0)]
    ours["devices"] = [("GPU-0a1b2c3d-0000-1111-2222-333344445555", 1)]
    found = rlpt.sync.compare_environments(ours, theirs, "nccl")
    assert [f["field"] for f in found] == ["device", "NCCL_CUMEM_ENABLE"]
    assert found[1]["ours"] == "'0'" and found[1]["theirs"] == "unset"
    assert rlpt.sync.compare_environments(ours, theirs, "version") == []
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.require_parity(ours, theirs, "nccl", peer="engine 0")
    assert e.value.id == "rlpt.sync.preflight" and "on engine 0" in e.value.message
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.decode_environment(b"RLSF" + bytes(80))
    assert e.value.id == "rlpt.sync.wire"
    with pytest.raises(rlpt.Error) as e:
        rlpt.sync.compare_environments(ours, theirs, "strict")
    assert e.value.id == "rlpt.python.bad_option"
    mine = rlpt.sync.capture_environment(["RLPT_TEST_UNSET_VARIABLE"])
    assert mine["variables"] == {"RLPT_TEST_UNSET_VARIABLE": None}
