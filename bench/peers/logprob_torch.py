"""rlpt logits -> logprob/entropy (and backward) vs torch, verl and TRL on CPU, same inputs, same run.

    .venv/bin/python bench/peers/logprob_torch.py [--build build/logprob] [--threads N] [--quick]

Peers, all on the logits rlpt gets (written to a temp dir and read back by
build/.../bench_logprob_runner):
- torch: log_softmax(logits / T) + gather + entropy -(p·logp).sum(-1), eager, in the logits' dtype
  (the issue's baseline); backward through torch.autograd of Σ dlogp·logp + dH·H.
- verl 0.9.1: verl.utils.torch_functional.logprobs_from_logits (row loop without flash-attn) +
  entropy_from_logits.
- TRL 1.16: trl.trainer.utils.selective_log_softmax(temperature=T) + entropy_from_logits
  (128-row chunks).
rlpt's logprob and entropy are checked against an fp64 torch evaluation of the first 64 rows before
any time is printed. Columns: median seconds; peer / rlpt ratios; rlpt's effective GB/s (logits
bytes read once) and its fraction of the copy bandwidth measured by the runner in the same run with
the same threads (the copy figure counts bytes read + written); peak extra resident memory beyond
the inputs for rlpt and plain torch, measured in a fresh process (ru_maxrss). A peer call longer
than 3 s is timed once. verl and TRL (Python row/chunk loops) are timed at 4096 x 32768 only.
Shapes: 4096 x 32768 (f32 and bf16, with backward) and 8192 x 151936 (bf16 forward only: f32 would
be 5 GB of logits and torch's temporaries do not fit next to other work on a 24 GB machine).
"""
import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

import common

versions = common.check_venv()

import torch  # noqa: E402
from trl.trainer.utils import entropy_from_logits as trl_entropy  # noqa: E402
from trl.trainer.utils import selective_log_softmax  # noqa: E402
from verl.utils.torch_functional import entropy_from_logits as verl_entropy  # noqa: E402
from verl.utils.torch_functional import logprobs_from_logits  # noqa: E402

TORCH_DTYPE = {"f32": torch.float32, "bf16": torch.bfloat16}


def make_inputs(n, v, dtype, seed, out_dir: Path):
    g = torch.Generator().manual_seed(seed)
    x = (3.0 * torch.randn(n, v, generator=g)).to(TORCH_DTYPE[dtype])
    t = torch.randint(0, v, (n,), generator=g)
    dl = torch.randn(n, generator=g)
    dh = torch.randn(n, generator=g)
    raw = x.view(torch.int16) if dtype == "bf16" else x
    raw.numpy().tofile(out_dir / ("logits.bf16" if dtype == "bf16" else "logits.f32"))
    t.numpy().astype(np.int64).tofile(out_dir / "targets.i64")
    dl.numpy().astype(np.float32).tofile(out_dir / "dlogp.f32")
    dh.numpy().astype(np.float32).tofile(out_dir / "dentropy.f32")
    return x, t, dl, dh


def torch_forward(x, t, temp):
    z = x / temp if temp != 1.0 else x
    lsm = torch.log_softmax(z, dim=-1)
    lp = lsm.gather(-1, t[:, None]).squeeze(-1)
    ent = -(lsm.exp() * lsm).sum(-1)
    return lp, ent


def torch_fwd_bwd(x, t, dl, dh, temp):
    xr = x.detach().requires_grad_(True)
    lp, ent = torch_forward(xr, t, temp)
    ((lp.float() * dl).sum() + (ent.float() * dh).sum()).backward()
    return xr.grad


def verl_forward(x, t, temp):
    z = x / temp if temp != 1.0 else x
    return logprobs_from_logits(z, t), verl_entropy(z)


def trl_forward(x, t, temp):
    return selective_log_softmax(x, t, temperature=temp), trl_entropy(x / temp if temp != 1.0 else x)


def timed(fn, threads, repeat):
    """Median seconds of fn(); a first call longer than 3 s is taken as the figure (the row-loop
    peers need minutes per call at the large shapes)."""
    import time
    torch.set_num_threads(threads)
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    if first > 3.0:
        return first
    return common.timeit(fn, repeat=repeat, warmup=0, threads=threads)


def check(out_dir: Path, x, t, temp, n_check=64):
    z = x[:n_check].double() / temp
    lsm = torch.log_softmax(z, -1)
    want_lp = lsm.gather(-1, t[:n_check, None]).squeeze(-1).numpy()
    want_ent = (-(lsm.exp() * lsm).sum(-1)).numpy()
    got_lp = np.fromfile(out_dir / "rlpt_logp.f32", dtype=np.float32)[:n_check]
    got_ent = np.fromfile(out_dir / "rlpt_entropy.f32", dtype=np.float32)[:n_check]
    err = max(np.max(np.abs(got_lp - want_lp)), np.max(np.abs(got_ent - want_ent)))
    if not err < 1e-3:
        sys.exit(f"rlpt disagrees with the fp64 torch reference (max abs error {err:.3g})")
    return err


PEAK_SCRIPT = textwrap.dedent("""
    import torch, numpy as np
    n, v, dtype, temp, which, threads = {n}, {v}, {dtype!r}, {temp}, {which!r}, {threads}
    torch.set_num_threads(threads)
    d = {dir!r}
    if dtype == "bf16":
        x = torch.from_numpy(np.fromfile(d + "/logits.bf16", dtype=np.int16).reshape(n, v)).view(torch.bfloat16)
    else:
        x = torch.from_numpy(np.fromfile(d + "/logits.f32", dtype=np.float32).reshape(n, v))
    t = torch.from_numpy(np.fromfile(d + "/targets.i64", dtype=np.int64))
    dl = torch.from_numpy(np.fromfile(d + "/dlogp.f32", dtype=np.float32))
    dh = torch.from_numpy(np.fromfile(d + "/dentropy.f32", dtype=np.float32))
    def status(field):
        for line in open("/proc/self/status"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    {body}
    if which == "torch_bwd":
        xr = x.detach().requires_grad_(True)
        open("/proc/self/clear_refs", "w").write("5")
        base = status("VmRSS:")
        lp, ent = forward(xr, t, temp)
        ((lp.float() * dl).sum() + (ent.float() * dh).sum()).backward()
        grad_bytes = xr.grad.numel() * xr.grad.element_size()  # the output, like rlpt's gradient buffer
    else:
        open("/proc/self/clear_refs", "w").write("5")
        base = status("VmRSS:")
        forward(x, t, temp)
        grad_bytes = 0
    print(status("VmHWM:") - base - grad_bytes)
""")

FORWARD_SOURCE = """def forward(x, t, temp):
        z = x / temp if temp != 1.0 else x
        lsm = torch.log_softmax(z, dim=-1)
        lp = lsm.gather(-1, t[:, None]).squeeze(-1)
        ent = -(lsm.exp() * lsm).sum(-1)
        return lp, ent"""


def peak_extra(out_dir, n, v, dtype, temp, which, threads):
    """Peak resident bytes a peer adds beyond its inputs, in a fresh interpreter."""
    code = PEAK_SCRIPT.format(n=n, v=v, dtype=dtype, temp=temp, which=which, threads=threads, dir=str(out_dir),
                              body=FORWARD_SOURCE)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return int(proc.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build", default=str(common.ROOT / "build" / "logprob"))
    parser.add_argument("--threads", type=int, default=common.CORES)
    parser.add_argument("--quick", action="store_true", help="skip the 8192 x 151936 case")
    args = parser.parse_args()
    runner = Path(args.build) / "bench" / "logprob" / "bench_logprob_runner"
    if not runner.exists():
        sys.exit(f"{runner} not found: cmake --build {args.build} --target bench_logprob_runner")
    print(" ".join(f"{k} {v}" for k, v in versions.items() if v), f"threads {args.threads}")
    cases = [(4096, 32768, "f32", 0.7, True), (4096, 32768, "bf16", 0.7, True)]
    if not args.quick:
        cases.append((8192, 151936, "bf16", 1.0, False))
    rows, mem_rows = [], []
    torch.set_num_threads(args.threads)
    for n, v, dtype, temp, backward in cases:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp)
            x, t, dl, dh = make_inputs(n, v, dtype, 1234, out)
            repeat = 3 if n * v > 1 << 28 else 5
            r = common.run_cpp(runner, [out, n, v, dtype, temp, args.threads, repeat, int(backward)])
            err = check(out, x, t, temp)
            big = n * v > 1 << 28
            th = args.threads
            row = {"case": f"{n}x{v} {dtype} fwd", "rlpt": r["seconds"],
                   "torch": timed(lambda: torch_forward(x, t, temp), th, 3),
                   # the row-loop peers take minutes per call at 8192 x 151936: timed at the small shape only
                   "verl": None if big else timed(lambda: verl_forward(x, t, temp), th, 3),
                   "trl": None if big else timed(lambda: trl_forward(x, t, temp), th, 3),
                   "rlpt GB/s": f"{r['gbps']:.2f}", "of copy": f"{100 * r['gbps'] / r['copy_gbps']:.0f} %",
                   "copy GB/s": f"{r['copy_gbps']:.2f}", "max |err|": f"{err:.1e}"}
            rows.append(row)
            print(json.dumps(row), flush=True)  # progress
            mem = {"case": row["case"], "rlpt_MB": r["extra_fwd_bytes"] / 1e6}
            b = peak_extra(out, n, v, dtype, temp, "torch", th)
            mem["torch_MB"] = None if b is None else b / 1e6
            mem["logits_MB"] = x.numel() * x.element_size() / 1e6
            mem_rows.append(mem)
            if backward:
                rows.append({"case": f"{n}x{v} {dtype} fwd+bwd", "rlpt": r["seconds"] + r["backward_seconds"],
                             "torch": timed(lambda: torch_fwd_bwd(x, t, dl, dh, temp), th, 3),
                             "verl": None, "trl": None,
                             "rlpt GB/s": f"{r['backward_gbps']:.2f} (bwd)",
                             "of copy": f"{100 * r['backward_gbps'] / r['copy_gbps']:.0f} %",
                             "copy GB/s": f"{r['copy_gbps']:.2f}", "max |err|": "-"})
                print(json.dumps(rows[-1]), flush=True)
                b = peak_extra(out, n, v, dtype, temp, "torch_bwd", th)
                mem_rows.append({"case": f"{n}x{v} {dtype} fwd+bwd", "rlpt_MB": r["extra_bwd_bytes"] / 1e6,
                                 "torch_MB": None if b is None else b / 1e6,
                                 "logits_MB": x.numel() * x.element_size() / 1e6})
            del x
    print("\nmedian seconds; peer/rlpt > 1: rlpt is faster. rlpt GB/s: logits bytes read / forward time "
          "(bwd: 1 read + 1 write / backward time); 'of copy': against the copy bandwidth the runner measured "
          "in the same run (read + write bytes)")
    common.print_table(rows)
    print("\npeak resident memory beyond inputs and outputs (MB; Linux VmHWM after a reset)")
    common.print_table(mem_rows, base="rlpt_MB")


if __name__ == "__main__":
    main()
