# SPDX-License-Identifier: Apache-2.0
"""rlpt.lm_head_logprob_entropy (rlpt's host fused lm-head as a torch op): values and gradients
against a float64 torch reference of log_softmax(hidden @ weight.T / T), bf16 inputs held to the
reference of their own values (the product accumulated in float32, never rounded to bf16),
ignore_index, [B, T, D] inputs, batch invariance, verl's FusedLinearForPPO on float32, the op's
registration (opcheck) and errors."""
import pytest
import torch

import rlpt
from conftest import close

if not rlpt._C.lm_head:
    pytest.skip("the package was built without Eigen: no fused lm-head", allow_module_level=True)

ops = torch.ops.rlpt


def _builds():
    """The kernel builds this CPU and package can run: baseline, and avx2 where available."""
    out = ["baseline"]
    try:
        rlpt.lm_head_isa("avx2")
        out.append("avx2")
    except rlpt.Error:
        pass
    finally:
        rlpt.lm_head_isa("auto")
    return out


BUILDS = _builds()


@pytest.fixture(params=BUILDS)
def build(request):
    """Runs the test on each kernel build (the AVX2 + FMA one is a library of its own)."""
    assert rlpt.lm_head_isa(request.param) == request.param
    yield request.param
    rlpt.lm_head_isa("auto")


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []


def test_the_avx2_build_is_loaded_where_the_cpu_has_it():
    import platform
    if platform.machine() not in ("x86_64", "AMD64") or not {"avx2", "fma"} <= set(_cpu_flags()):
        pytest.skip("not an x86-64 CPU with AVX2 and FMA")
    assert rlpt.lm_head_isa() == "avx2"
    assert BUILDS == ["baseline", "avx2"]


def make(gen, n=37, d=48, v=301, dtype=torch.float32, scale=0.5):
    h = (torch.randn(n, d, generator=gen) * scale).to(dtype)
    w = (torch.randn(v, d, generator=gen) * scale).to(dtype)
    y = torch.randint(0, v, (n,), generator=gen)
    return h, w, y


def reference(h, w, y, temperature=1.0, ignore_index=-100):
    """float64 logp / entropy of the inputs' own values (bf16 widened exactly)."""
    z = (h.double() @ w.double().T) / temperature
    lsm = torch.log_softmax(z, -1)
    ent = -(lsm.exp() * lsm).sum(-1)
    keep = y != ignore_index
    logp = torch.where(keep, lsm.gather(-1, torch.where(keep, y, 0).unsqueeze(-1)).squeeze(-1), 0.0)
    return logp, ent


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
@pytest.mark.parametrize("n,d,v", [(1, 8, 5), (37, 48, 301), (200, 64, 1500), (5, 3, 2049)])
def test_values_match_a_float64_reference(build, gen, n, d, v, temperature):
    h, w, y = make(gen, n, d, v)
    logp, ent = rlpt.lm_head_logprob_entropy(h, w, y, temperature=temperature)
    want_lp, want_ent = reference(h, w, y, temperature)
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32 and logp.shape == (n,)
    close(logp, want_lp, 2e-5, 2e-5, "logp")
    close(ent, want_ent, 2e-5, 2e-5, "entropy")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_low_precision_inputs_are_accumulated_in_float32(build, gen, dtype):
    # The reference takes the bf16 / f16 values themselves: rlpt's error is float32 accumulation
    # only. Rounding the logits to bf16 first (as a bf16 matmul does) is far off.
    h, w, y = make(gen, 64, 256, 2000, dtype=dtype, scale=1.0)
    logp, ent = rlpt.lm_head_logprob_entropy(h, w, y)
    want_lp, want_ent = reference(h, w, y)
    close(logp, want_lp, 1e-5, 1e-4, "logp")
    close(ent, want_ent, 1e-5, 1e-4, "entropy")
    if dtype == torch.bfloat16:
        z16 = (h @ w.T).float()  # torch's bf16 product, rounded to bf16
        rounded = torch.log_softmax(z16.double(), -1).gather(-1, y[:, None]).squeeze(-1)
        assert float((rounded - want_lp).abs().max()) > 20 * float((logp.double() - want_lp).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_gradients_match_a_float64_reference(build, gen, dtype, temperature):
    h, w, y = make(gen, 53, 40, 700, dtype=dtype)
    y[[3, 10]] = -100
    a = torch.randn(53, generator=gen)
    b = torch.randn(53, generator=gen)
    hr, wr = h.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    logp, ent = rlpt.lm_head_logprob_entropy(hr, wr, y, temperature=temperature)
    ((logp * a).sum() + (ent * b).sum()).backward()
    h64, w64 = h.double().requires_grad_(), w.double().requires_grad_()
    lp64, ent64 = reference(h64, w64, y, temperature)
    ((lp64 * a.double()).sum() + (ent64 * b.double()).sum()).backward()
    assert hr.grad.dtype == dtype and wr.grad.dtype == dtype
    tol = 2e-5 if dtype == torch.float32 else 1e-2  # bf16: the gradient is rounded to bf16 once
    close(hr.grad, h64.grad, tol, tol * float(h64.grad.abs().max()), "grad hidden")
    close(wr.grad, w64.grad, tol, tol * float(w64.grad.abs().max()), "grad weight")


def test_one_gradient_only_and_logp_only(build, gen):
    h, w, y = make(gen)
    hr = h.clone().requires_grad_()
    logp, _ = rlpt.lm_head_logprob_entropy(hr, w, y)
    logp.sum().backward()
    h64 = h.double().requires_grad_()
    reference(h64, w.double(), y)[0].sum().backward()
    close(hr.grad, h64.grad, 2e-5, 2e-6, "grad hidden (weight frozen)")
    wr = w.clone().requires_grad_()
    _, ent = rlpt.lm_head_logprob_entropy(h, wr, y)
    ent.sum().backward()
    w64 = w.double().requires_grad_()
    reference(h.double(), w64, y)[1].sum().backward()
    close(wr.grad, w64.grad, 2e-5, 2e-6, "grad weight from entropy only")


def test_ignored_targets_get_zero_logp_and_no_logp_gradient(build, gen):
    h, w, y = make(gen, 8, 16, 50)
    y[:] = -100
    hr = h.clone().requires_grad_()
    logp, ent = rlpt.lm_head_logprob_entropy(hr, w, y)
    assert torch.equal(logp, torch.zeros(8))
    close(ent, reference(h, w, y)[1], 2e-5, 2e-5, "entropy of ignored rows")
    logp.sum().backward()
    assert torch.equal(hr.grad, torch.zeros_like(h))
    y2 = torch.full((8,), 7)
    y2[2] = 99  # another ignore_index
    lp2, _ = rlpt.lm_head_logprob_entropy(h, w, y2, ignore_index=99)
    assert float(lp2[2]) == 0.0 and float(lp2[0]) < 0.0


def test_batched_input_and_batch_invariance(build, gen):
    h, w, y = make(gen, 6 * 40, 32, 900)
    logp, ent = rlpt.lm_head_logprob_entropy(h.view(6, 40, 32), w, y.view(6, 40))
    assert logp.shape == (6, 40)
    flat_lp, flat_ent = rlpt.lm_head_logprob_entropy(h, w, y)
    assert torch.equal(logp.view(-1), flat_lp) and torch.equal(ent.view(-1), flat_ent)
    # a row's bits do not depend on the batch around it
    for rows in (slice(0, 1), slice(17, 18), slice(5, 200)):
        lp, en = rlpt.lm_head_logprob_entropy(h[rows], w, y[rows])
        assert torch.equal(lp, flat_lp[rows]) and torch.equal(en, flat_ent[rows])


def test_threads_give_the_same_bits(build, gen):
    h, w, y = make(gen, 300, 64, 3000)
    a = torch.randn(300, generator=gen)
    results = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            hr, wr = h.clone().requires_grad_(), w.clone().requires_grad_()
            lp, en = rlpt.lm_head_logprob_entropy(hr, wr, y)
            ((lp + en) * a).sum().backward()
            results.append((lp, en, hr.grad, wr.grad))
        finally:
            torch.set_num_threads(1)
    for x, z in zip(*results):
        assert torch.equal(x, z)


def test_strided_inputs_are_copied_or_refused(gen):
    h, w, y = make(gen, 12, 16, 40)
    ht = h.T.contiguous().T  # same values, column-major
    rlpt.reset_copy_stats()
    lp, _ = rlpt.lm_head_logprob_entropy(ht, w, y)
    assert torch.equal(lp, rlpt.lm_head_logprob_entropy(h, w, y)[0])
    assert rlpt.copy_stats() == {("copy", "hidden"): 1}
    # evenly spaced rows of a wider buffer are read in place
    wide = torch.zeros(12, 40)
    wide[:, :16] = h
    rlpt.reset_copy_stats()
    assert torch.equal(rlpt.lm_head_logprob_entropy(wide[:, :16], w, y)[0], lp)
    assert rlpt.copy_stats() == {}
    rlpt.set_strict(True)
    try:
        with pytest.raises(rlpt.Error) as e:
            rlpt.lm_head_logprob_entropy(ht, w, y)
        assert e.value.id == "rlpt.python.strides" and "hidden" in str(e.value)
    finally:
        rlpt.set_strict(False)


@pytest.mark.parametrize("case,err,needle", [
    ("dtype_mix", "rlpt.python.dtype", "hidden is Float but weight is BFloat16"),
    ("int_hidden", "rlpt.python.dtype", "hidden has dtype Long"),
    ("float_targets", "rlpt.python.dtype", "targets must be integer token ids"),
    ("shape", "rlpt.python.shape", "do not match"),
    ("width", "rlpt.python.shape", "do not match"),
    ("target_range", "rlpt.logprob.target_out_of_range", "target 301 of row 4"),
    ("temperature", "rlpt.logprob.temperature", "temperature must be finite and > 0, got 0"),
    ("empty_vocab", "rlpt.logprob.shape_mismatch", "vocabulary is empty"),
])
def test_errors_name_the_field(build, gen, case, err, needle):
    h, w, y = make(gen)
    kw = {}
    if case == "dtype_mix":
        w = w.bfloat16()
    elif case == "int_hidden":
        h = h.long()
    elif case == "float_targets":
        y = y.float()
    elif case == "shape":
        y = y[:-1]
    elif case == "width":
        w = w[:, :-1]
    elif case == "target_range":
        y[4] = 301
    elif case == "temperature":
        kw["temperature"] = 0.0
    elif case == "empty_vocab":
        w = w[:0]
    with pytest.raises(rlpt.Error) as e:
        rlpt.lm_head_logprob_entropy(h, w, y, **kw)
    assert e.value.id == err and needle in str(e.value), str(e.value)


def test_isa_choice_errors():
    with pytest.raises(rlpt.Error) as e:
        rlpt.lm_head_isa("avx512")
    assert e.value.id == "rlpt.python.bad_option" and "auto, avx2, baseline" in str(e.value)


def test_opcheck(gen):
    h, w, y = make(gen, 9, 8, 33)
    torch.library.opcheck(ops.lm_head_logprob_entropy.default, (h.requires_grad_(), w.requires_grad_(), y, 1.0, -100))


def test_same_as_verls_fused_linear_for_ppo_on_float32(gen):
    tf = pytest.importorskip("verl.utils.experimental.torch_functional")
    h, w, y = make(gen, 96, 64, 1000)
    a, b = torch.randn(96, generator=gen), torch.randn(96, generator=gen)
    outs = []
    for fn in (lambda hh, ww: tf.FusedLinearForPPO(chunk_size=32)(hh, ww, y, temperature=0.8),
               lambda hh, ww: rlpt.lm_head_logprob_entropy(hh, ww, y, temperature=0.8)):
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        lp, en = fn(hh, ww)
        ((lp * a).sum() + (en * b).sum()).backward()
        outs.append((lp, en, hh.grad, ww.grad))
    for got, want, what in zip(outs[1], outs[0], ("logp", "entropy", "grad hidden", "grad weight")):
        close(got, want, 1e-5, 1e-5 * float(want.detach().abs().max()), what)


def test_a_package_without_the_avx2_library_runs_the_baseline_build(tmp_path):
    # The library is optional at run time: a copy of the package without it must fall back.
    import pathlib
    import shutil
    import subprocess
    import sys

    src = pathlib.Path(rlpt.__file__).parent
    if not list(src.glob("_lm_head_avx2*")):
        pytest.skip("this package has no AVX2 library")
    shutil.copytree(src, tmp_path / "rlpt", ignore=shutil.ignore_patterns("_lm_head_avx2*", "__pycache__"))
    code = ("import rlpt, torch; h = torch.randn(4, 8); w = torch.randn(16, 8); "
            "lp, _ = rlpt.lm_head_logprob_entropy(h, w, torch.tensor([1, 2, 3, 4])); "
            "assert bool((lp < 0).all()); print(rlpt.lm_head_isa())")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "baseline"


# --- verl's FusedLinearForPPO (use_fused_kernels) --------------------------------------------------

def _verl_tf():
    return pytest.importorskip("verl.utils.experimental.torch_functional")


@pytest.mark.parametrize("shape", [(96,), (4, 24)])
def test_verl_drop_in_is_verls_fused_linear_on_float32(gen, shape):
    _verl_tf()
    import rlpt.verl as rv

    n = 96
    h, w, y = make(gen, n, 64, 1000)
    a = torch.randn(shape, generator=gen)
    outs = []
    for cls in (rv._verl_fused_linear(), rv.FusedLinearForPPO):
        hh, ww = h.view(*shape, 64).clone().requires_grad_(), w.clone().requires_grad_()
        lp, en = cls(chunk_size=32)(hh, ww, y.view(shape).int(), temperature=0.9)
        assert lp.dtype == torch.float32 and en.dtype == torch.float32 and lp.shape == shape
        ((lp * a).sum() + (en * a).sum()).backward()
        outs.append((lp, en, hh.grad, ww.grad))
    for got, want, what in zip(outs[1], outs[0], ("logp", "entropy", "grad hidden", "grad weight")):
        close(got, want, 1e-5, 1e-5 * float(want.detach().abs().max()), what)


def test_verl_drop_in_on_bf16_is_closer_to_the_exact_values(gen):
    _verl_tf()
    import rlpt.verl as rv

    h, w, y = make(gen, 64, 256, 2000, dtype=torch.bfloat16, scale=1.0)
    want_lp, _ = reference(h, w, y)
    verl_lp, verl_ent = rv._verl_fused_linear()()(h, w, y)
    lp, ent = rv.FusedLinearForPPO()(h, w, y)
    assert ent.dtype == verl_ent.dtype == torch.bfloat16  # verl's dtype for the entropy
    assert float((lp.double() - want_lp).abs().max()) * 20 < float((verl_lp.double() - want_lp).abs().max())


def test_verl_patch_swaps_fused_linear_for_ppo():
    tf = _verl_tf()
    import rlpt.verl as rv

    original = tf.FusedLinearForPPO
    rv.patch()
    try:
        from verl.utils.experimental.torch_functional import FusedLinearForPPO  # as verl's model forwards do

        assert FusedLinearForPPO is rv.FusedLinearForPPO
        assert rv._verl_fused_linear() is original
    finally:
        rv.unpatch()
    assert tf.FusedLinearForPPO is original
    with pytest.raises(ValueError, match="Unsupported FusedLinearForPPO backend"):
        rv.FusedLinearForPPO(impl_backend="triton")


def test_edge_shapes_and_nonfinite_inputs(build):
    for shape in [(0, 8), (2, 0, 8)]:  # no tokens: empty results, zero weight gradient
        h = torch.randn(*shape, requires_grad=True)
        w = torch.randn(5, 8, requires_grad=True)
        lp, en = rlpt.lm_head_logprob_entropy(h, w, torch.zeros(shape[:-1], dtype=torch.long))
        assert lp.shape == en.shape == shape[:-1]
        (lp.sum() + en.sum()).backward()
        assert h.grad.shape == shape and torch.equal(w.grad, torch.zeros(5, 8))
    lp, en = rlpt.lm_head_logprob_entropy(torch.randn(3, 1), torch.randn(1, 1), torch.zeros(3, dtype=torch.long))
    assert torch.equal(lp, torch.zeros(3)) and torch.equal(en, torch.zeros(3))  # one word: p = 1
    h = torch.randn(2, 4)
    h[1, 2] = float("nan")
    with pytest.raises(rlpt.Error) as e:
        rlpt.lm_head_logprob_entropy(h, torch.randn(6, 4), torch.tensor([1, 2]))
    assert e.value.id == "rlpt.logprob.nonfinite" and "row 1" in str(e.value)


def _forked_child(h, w, y, want_lp, q):
    torch.set_num_threads(2)
    lp, _ = rlpt.lm_head_logprob_entropy(h, w, y)
    q.put(bool(torch.equal(lp, want_lp)))


def test_a_forked_child_builds_its_own_threads(gen):
    # The parent's pool has worker threads; a fork (DataLoader workers) has none of them.
    import multiprocessing

    h, w, y = make(gen, 300, 32, 2000)
    torch.set_num_threads(2)
    try:
        want_lp, _ = rlpt.lm_head_logprob_entropy(h, w, y)
    finally:
        torch.set_num_threads(1)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_forked_child, args=(h, w, y, want_lp, q))
    p.start()
    p.join(timeout=120)
    if p.is_alive():
        p.kill()
        pytest.fail("the forked child hung in the fused lm-head")
    assert p.exitcode == 0 and q.get(timeout=10)
