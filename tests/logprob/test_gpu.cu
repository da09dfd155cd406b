// SPDX-License-Identifier: Apache-2.0
// Device logprob kernels against the host implementations: forward/backward/fused per dtype,
// bitwise batch invariance on the device, sequences, vocab-parallel stages, the cuBLAS fused
// lm-head, and the device error counters.
#include <rlpt/cuda/logprob.cuh>
#ifdef RLPT_TEST_LM_HEAD // components lm_head (Eigen, the host reference) and cuda_lm_head (cuBLAS)
#include <rlpt/cuda/logprob/lm_head.cuh>
#include <rlpt/logprob/lm_head.hpp>

#include <cublas_v2.h>
#endif

#include "reference.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include "support/device_buffer.cuh"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

using rlpt::index_t;
namespace lt = rlpt::test;

namespace {

template <class T> using dev_buffer = rlpt::test::device_buffer<T>;

template <class T> std::vector<float> as_floats(const std::vector<T>& v) {
  std::vector<float> r(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}

template <class T> struct host_case {
  index_t n, v, stride;
  std::vector<T> x;
  std::vector<index_t> t;
};

template <class T> host_case<T> make_case(lt::rng& g, index_t n, index_t v, index_t pad) {
  host_case<T> c{n, v, v + pad, lt::random_logits<T>(g, static_cast<std::size_t>(n * (v + pad)), 3.0), {}};
  for (index_t r = 0; r < n; ++r) c.t.push_back(g.integer(0, v - 1));
  c.t[0] = -100;
  return c;
}

// gradient tolerance: fp32 math either side, then one rounding to T
template <class T> double grad_rel() { return sizeof(T) == 2 ? 1.0 / 128 : 1e-4; }

} // namespace

TEST_CASE_TEMPLATE("device forward and backward match the host", T, float, rlpt::bf16, rlpt::f16) {
  lt::rng g(60);
  for (const index_t v : {1000, 4099, 32769}) {
    for (const index_t pad : {0, 3}) {
      auto c = make_case<T>(g, 37, v, pad);
      const rlpt::logprob_options o{.temperature = 0.8f};
      std::vector<float> hl(c.n), he(c.n), hs(c.n);
      const rlpt::view2d<const T> hx(c.x.data(), c.n, v, c.stride);
      rlpt::logprob_entropy(hx, c.t, {.logp = hl, .entropy = he, .saved = {.lse = hs}}, o);
      const auto dl = g.normals<float>(static_cast<std::size_t>(c.n)),
                 dh = g.normals<float>(static_cast<std::size_t>(c.n));
      std::vector<T> hg(c.x.size());
      rlpt::logprob_entropy_backward(hx, c.t, {.dlogp = dl, .dentropy = dh, .entropy = he, .saved = {.lse = hs}},
                                     rlpt::view2d<T>(hg.data(), c.n, v, c.stride), o);

      dev_buffer<T> dx(c.x);
      dev_buffer<index_t> dt(c.t);
      dev_buffer<float> lp(c.n), en(c.n), ls(c.n), ddl(dl), ddh(dh);
      dev_buffer<index_t> cnt(3);
      const rlpt::device_view2d<const T> x(dx.data(), c.n, v, c.stride);
      rlpt::logprob_entropy(x, dt.cview(),
                            {.logp = lp.view(), .entropy = en.view(), .lse = ls.view(), .counters = cnt.view()}, o,
                            nullptr);
      const auto got_lp = lp.get(), got_en = en.get(), got_ls = ls.get();
      INFO("V " << v << " pad " << pad);
      RLPT_CHECK_CLOSE(got_lp, hl, 1e-5, 1e-4);
      RLPT_CHECK_CLOSE(got_en, he, 1e-5, 1e-4);
      RLPT_CHECK_CLOSE(got_ls, hs, 1e-5, 1e-4);
      CHECK(cnt.get() == std::vector<index_t>{0, 0, 0});

      dev_buffer<T> dgrad(c.x.size());
      const rlpt::device_logprob_backward_inputs din{.dlogp = ddl.cview(),
                                                     .dentropy = ddh.cview(),
                                                     .logp = lp.cview(),
                                                     .entropy = en.cview(),
                                                     .saved = {.lse = ls.cview()}};
      rlpt::logprob_entropy_backward(x, dt.cview(), din, rlpt::device_view2d<T>(dgrad.data(), c.n, v, c.stride), o,
                                     nullptr);
      std::vector<float> got, want;
      const auto gv = dgrad.get();
      for (index_t r = 0; r < c.n; ++r)
        for (index_t j = 0; j < v; ++j) {
          got.push_back(static_cast<float>(gv[static_cast<std::size_t>(r * c.stride + j)]));
          want.push_back(static_cast<float>(hg[static_cast<std::size_t>(r * c.stride + j)]));
        }
      RLPT_CHECK_CLOSE(got, want, grad_rel<T>(), 1e-7);

      // in place over a copy of the logits: the same bits as out of place
      dev_buffer<T> inplace(c.x);
      const rlpt::device_view2d<T> w(inplace.data(), c.n, v, c.stride);
      rlpt::logprob_entropy_backward(rlpt::device_view2d<const T>(w), dt.cview(), din, w, o, nullptr);
      const auto ip = inplace.get();
      bool same = true;
      for (index_t r = 0; r < c.n; ++r)
        same = same && std::memcmp(ip.data() + r * c.stride, gv.data() + r * c.stride, sizeof(T) * v) == 0;
      CHECK(same);
    }
  }
}

TEST_CASE_TEMPLATE("device rows are bitwise independent of N, position and alignment", T, float, rlpt::bf16) {
  lt::rng g(61);
  const index_t v = 30011, pool_n = 5;
  const auto pool = lt::random_logits<T>(g, static_cast<std::size_t>(pool_n * v), 4.0);
  const auto run = [&](index_t n, index_t offset, index_t stride, index_t shift) {
    std::vector<T> x(static_cast<std::size_t>(n * stride + offset + 8));
    std::vector<index_t> t(static_cast<std::size_t>(n));
    for (index_t i = 0; i < n; ++i) {
      std::memcpy(x.data() + offset + i * stride, pool.data() + ((i + shift) % pool_n) * v, sizeof(T) * v);
      t[static_cast<std::size_t>(i)] = (i + shift) % pool_n * 7;
    }
    dev_buffer<T> dx(x);
    dev_buffer<index_t> dt(t);
    dev_buffer<float> lp(n), en(n);
    rlpt::logprob_entropy(rlpt::device_view2d<const T>(dx.data() + offset, n, v, stride), dt.cview(),
                          {.logp = lp.view(), .entropy = en.view()}, {}, nullptr);
    std::vector<std::pair<float, float>> r;
    const auto a = lp.get(), b = en.get();
    for (index_t i = 0; i < n; ++i) r.push_back({a[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)]});
    return r;
  };
  std::vector<std::pair<float, float>> canon;
  for (index_t s = 0; s < pool_n; ++s) canon.push_back(run(1, 0, v, s)[0]);
  for (const index_t n : {3, 64, 301})
    for (const index_t offset : {0, 1, 5})
      for (const index_t stride : {v, v + 1, v + 9}) {
        const auto got = run(n, offset, stride, n % pool_n);
        for (index_t i = 0; i < n; ++i) {
          const auto& want = canon[static_cast<std::size_t>((i + n % pool_n) % pool_n)];
          INFO("N " << n << " offset " << offset << " stride " << stride << " row " << i);
          CHECK(std::memcmp(&got[static_cast<std::size_t>(i)].first, &want.first, 4) == 0);
          CHECK(std::memcmp(&got[static_cast<std::size_t>(i)].second, &want.second, 4) == 0);
        }
      }
}

namespace logprob_gpu_test { // external linkage: RLPT_KERNEL templates are visibility("hidden")
struct ppo_like_grad {
  const float* adv;
  __device__ float2 operator()(index_t row, float logp, float entropy) const {
    return {-adv[row] * __expf(logp), -0.01f * (1.0f + 0.0f * entropy)};
  }
};
} // namespace logprob_gpu_test

TEST_CASE("fused forward+backward equals forward, then the gradient, then backward") {
  lt::rng g(62);
  auto c = make_case<rlpt::bf16>(g, 90, 20001, 0);
  const auto adv = g.normals<float>(90);
  dev_buffer<rlpt::bf16> dx(c.x), fused_grad(c.x.size()), sep_grad(c.x.size());
  dev_buffer<index_t> dt(c.t);
  dev_buffer<float> lp(90), en(90), ls(90), lp2(90), en2(90), ls2(90), dadv(adv);
  const rlpt::device_view2d<const rlpt::bf16> x(dx.data(), 90, 20001);
  rlpt::logprob_entropy_fused(x, dt.cview(), {.logp = lp.view(), .entropy = en.view(), .lse = ls.view()},
                              rlpt::device_view2d<rlpt::bf16>(fused_grad.data(), 90, 20001),
                              logprob_gpu_test::ppo_like_grad{dadv.data()}, {.temperature = 1.1f}, nullptr);
  rlpt::logprob_entropy(x, dt.cview(), {.logp = lp2.view(), .entropy = en2.view(), .lse = ls2.view()},
                        {.temperature = 1.1f}, nullptr);
  const auto flp = lp.get(), slp = lp2.get();
  CHECK(std::memcmp(flp.data(), slp.data(), flp.size() * 4) == 0); // same fold, same bits
  std::vector<float> dl(90), dh(90, -0.01f);
  for (index_t r = 0; r < 90; ++r)
    dl[static_cast<std::size_t>(r)] = -adv[static_cast<std::size_t>(r)] * std::exp(slp[static_cast<std::size_t>(r)]);
  dev_buffer<float> ddl(dl), ddh(dh);
  rlpt::logprob_entropy_backward(x, dt.cview(),
                                 {.dlogp = ddl.cview(),
                                  .dentropy = ddh.cview(),
                                  .logp = lp2.cview(),
                                  .entropy = en2.cview(),
                                  .saved = {.lse = ls2.cview()}},
                                 rlpt::device_view2d<rlpt::bf16>(sep_grad.data(), 90, 20001), {.temperature = 1.1f},
                                 nullptr);
  const auto a = as_floats(fused_grad.get()), b = as_floats(sep_grad.get());
  RLPT_CHECK_CLOSE(a, b, 1.0 / 128, 1e-7);
}

TEST_CASE("device sequences match the host over a packed layout") {
  lt::rng g(63);
  const index_t v = 777;
  const std::vector<index_t> off = {0, 4, 5, 12, 20};
  const index_t n = off.back();
  std::vector<index_t> tok(static_cast<std::size_t>(n));
  for (auto& t : tok) t = g.integer(0, v - 1);
  const auto x = lt::random_logits<float>(g, static_cast<std::size_t>(n * v));
  std::vector<float> hl(n), he(n), hs(n);
  const auto layout = rlpt::token_layout::packed(off);
  rlpt::sequence_logprob_entropy(rlpt::view2d<const float>(x.data(), n, v), tok, layout, {},
                                 {.logp = hl, .entropy = he, .saved = {.lse = hs}});
  dev_buffer<float> dx(x), lp(n), en(n), ls(n);
  dev_buffer<index_t> dt(tok), doff(off);
  const auto dlayout = rlpt::device_token_layout::packed(doff.cview(), n, 8);
  rlpt::sequence_logprob_entropy(rlpt::device_view2d<const float>(dx.data(), n, v), dt.cview(), dlayout, {},
                                 {.logp = lp.view(), .entropy = en.view(), .lse = ls.view()}, {}, nullptr);
  const auto a = lp.get(), b = en.get();
  RLPT_CHECK_CLOSE(a, hl, 1e-5, 1e-4);
  RLPT_CHECK_CLOSE(b, he, 1e-5, 1e-4);
  const std::vector<float> dl(static_cast<std::size_t>(n), 1.0f);
  std::vector<float> hg(x.size());
  rlpt::sequence_logprob_entropy_backward(rlpt::view2d<const float>(x.data(), n, v), tok, layout, {},
                                          {.dlogp = dl, .saved = {.lse = hs}}, rlpt::view2d<float>(hg.data(), n, v));
  dev_buffer<float> ddl(dl), dg(x.size());
  rlpt::sequence_logprob_entropy_backward(rlpt::device_view2d<const float>(dx.data(), n, v), dt.cview(), dlayout, {},
                                          {.dlogp = ddl.cview(), .logp = lp.cview(), .saved = {.lse = ls.cview()}},
                                          rlpt::device_view2d<float>(dg.data(), n, v), {}, nullptr);
  const auto got = dg.get();
  RLPT_CHECK_CLOSE(got, hg, 1e-4, 1e-7);
}

TEST_CASE("device vocab-parallel stages over 3 shards match the host") {
  lt::rng g(64);
  const index_t n = 40, v = 3001;
  const auto x = lt::random_logits<float>(g, static_cast<std::size_t>(n * v));
  std::vector<index_t> t(static_cast<std::size_t>(n));
  for (auto& y : t) y = g.integer(0, v - 1);
  std::vector<float> hl(n), he(n), hs(n);
  rlpt::logprob_entropy(rlpt::view2d<const float>(x.data(), n, v), t,
                        {.logp = hl, .entropy = he, .saved = {.lse = hs}});
  const std::vector<index_t> cut = {0, 1000, 1001, 3001};
  dev_buffer<float> dx(x);
  dev_buffer<index_t> dt(t);
  std::vector<std::vector<float>> comms;
  std::vector<std::unique_ptr<dev_buffer<float>>> comm_d, lmax_d;
  for (int q = 0; q < 3; ++q) {
    comm_d.push_back(std::make_unique<dev_buffer<float>>(static_cast<std::size_t>(4 * n)));
    lmax_d.push_back(std::make_unique<dev_buffer<float>>(static_cast<std::size_t>(n)));
    rlpt::vocab_parallel_local(rlpt::device_view2d<const float>(dx.data() + cut[q], n, cut[q + 1] - cut[q], v),
                               dt.cview(), {.begin = cut[q], .vocab = v}, comm_d.back()->view(), lmax_d.back()->view(),
                               {}, nullptr);
  }
  // the all-reduces, done on the host in rank order
  const auto reduce = [&](index_t begin, index_t count, bool is_max) {
    std::vector<std::vector<float>> h;
    for (auto& c : comm_d) h.push_back(c->get());
    for (index_t i = begin; i < begin + count; ++i) {
      float acc = h[0][static_cast<std::size_t>(i)];
      for (int q = 1; q < 3; ++q)
        acc = is_max ? std::max(acc, h[q][static_cast<std::size_t>(i)]) : acc + h[q][static_cast<std::size_t>(i)];
      for (auto& hq : h) hq[static_cast<std::size_t>(i)] = acc;
    }
    for (int q = 0; q < 3; ++q)
      RLPT_CUDA_CHECK(cudaMemcpy(comm_d[q]->data(), h[q].data(), h[q].size() * 4, cudaMemcpyHostToDevice));
  };
  reduce(0, n, true);
  for (int q = 0; q < 3; ++q) rlpt::vocab_parallel_rebase(comm_d[q]->view(), lmax_d[q]->cview(), nullptr);
  reduce(n, 3 * n, false);
  dev_buffer<float> lp(n), en(n), ls(n);
  rlpt::vocab_parallel_finish(comm_d[1]->cview(), dt.cview(),
                              {.logp = lp.view(), .entropy = en.view(), .lse = ls.view()}, {}, nullptr);
  const auto a = lp.get(), b = en.get();
  RLPT_CHECK_CLOSE(a, hl, 1e-5, 1e-4);
  RLPT_CHECK_CLOSE(b, he, 1e-5, 1e-4);
  // backward of shard 2: the host logits backward restricted to its columns
  const std::vector<float> dl(static_cast<std::size_t>(n), 0.5f);
  std::vector<float> hg(x.size());
  rlpt::logprob_entropy_backward(rlpt::view2d<const float>(x.data(), n, v), t, {.dlogp = dl, .saved = {.lse = hs}},
                                 rlpt::view2d<float>(hg.data(), n, v));
  dev_buffer<float> ddl(dl), dg(static_cast<std::size_t>(n * 2000));
  rlpt::vocab_parallel_backward(rlpt::device_view2d<const float>(dx.data() + 1001, n, 2000, v), dt.cview(),
                                {.begin = 1001, .vocab = v},
                                {.dlogp = ddl.cview(), .logp = lp.cview(), .saved = {.lse = ls.cview()}},
                                rlpt::device_view2d<float>(dg.data(), n, 2000), {}, nullptr);
  const auto got = dg.get();
  std::vector<float> want;
  for (index_t r = 0; r < n; ++r)
    for (index_t j = 1001; j < v; ++j) want.push_back(hg[static_cast<std::size_t>(r * v + j)]);
  RLPT_CHECK_CLOSE(got, want, 1e-4, 1e-7);
}

#ifdef RLPT_TEST_LM_HEAD
TEST_CASE("cuBLAS fused lm-head matches the host fused lm-head, forward and backward") {
  lt::rng g(65);
  const index_t n = 300, d = 128, v = 5000;
  const auto h = lt::random_logits<rlpt::bf16>(g, static_cast<std::size_t>(n * d), 1.0);
  const auto w = lt::random_logits<rlpt::bf16>(g, static_cast<std::size_t>(v * d), 0.2);
  std::vector<index_t> t(static_cast<std::size_t>(n));
  for (auto& y : t) y = g.integer(0, v - 1);
  t[3] = -100;
  std::vector<float> hl(n), he(n), hs(n);
  const rlpt::view2d<const rlpt::bf16> hh(h.data(), n, d), hw(w.data(), v, d);
  rlpt::fused_lm_head_logprob(hh, hw, t, {.logp = hl, .entropy = he, .saved = {.lse = hs}});
  const auto dl = g.normals<float>(static_cast<std::size_t>(n)), dh = g.normals<float>(static_cast<std::size_t>(n));
  std::vector<float> hgh(static_cast<std::size_t>(n * d)), hgw(static_cast<std::size_t>(v * d));
  rlpt::fused_lm_head_backward(hh, hw, t, dl, dh, he, hs, rlpt::view2d<float>(hgh.data(), n, d),
                               rlpt::view2d<float>(hgw.data(), v, d));

  cublasHandle_t cublas = nullptr;
  REQUIRE(cublasCreate(&cublas) == CUBLAS_STATUS_SUCCESS);
  dev_buffer<rlpt::bf16> dh_(h), dw(w);
  dev_buffer<index_t> dt(t);
  dev_buffer<float> lp(n), en(n), ls(n);
  const rlpt::device_lm_head_options o{.token_tile = 128, .vocab_tile = 1024};
  const rlpt::device_view2d<const rlpt::bf16> xh(dh_.data(), n, d), xw(dw.data(), v, d);
  rlpt::workspace ws;
  rlpt::fused_lm_head_logprob(ws, xh, xw, dt.cview(), {}, cublas, o, nullptr);
  dev_buffer<char> wsb(ws.bytes);
  ws.data = wsb.data();
  rlpt::fused_lm_head_logprob(ws, xh, xw, dt.cview(), {.logp = lp.view(), .entropy = en.view(), .lse = ls.view()},
                              cublas, o, nullptr);
  const auto a = lp.get(), b = en.get(), c = ls.get();
  RLPT_CHECK_CLOSE(a, hl, 1e-4, 1e-3);
  RLPT_CHECK_CLOSE(b, he, 1e-4, 1e-3);
  RLPT_CHECK_CLOSE(c, hs, 1e-4, 1e-3);

  dev_buffer<float> ddl(dl), ddh(dh), gh(static_cast<std::size_t>(n * d)), gw(static_cast<std::size_t>(v * d));
  rlpt::workspace bws;
  const auto call = [&](rlpt::workspace& wsx) {
    rlpt::fused_lm_head_backward(wsx, xh, xw, dt.cview(), ddl.cview(), ddh.cview(), en.cview(), ls.cview(),
                                 rlpt::device_view2d<float>(gh.data(), n, d),
                                 rlpt::device_view2d<float>(gw.data(), v, d), cublas, o, nullptr);
  };
  call(bws);
  dev_buffer<char> bwsb(bws.bytes);
  bws.data = bwsb.data();
  call(bws);
  const auto ggh = gh.get(), ggw = gw.get();
  // dlogits travel in bf16 to the tensor cores: compare against the gradient's scale
  double scale_h = 0, scale_w = 0;
  for (float x : hgh) scale_h = std::max(scale_h, static_cast<double>(std::fabs(x)));
  for (float x : hgw) scale_w = std::max(scale_w, static_cast<double>(std::fabs(x)));
  RLPT_CHECK_CLOSE(ggh, hgh, 0.0, 1e-2 * scale_h);
  RLPT_CHECK_CLOSE(ggw, hgw, 0.0, 1e-2 * scale_w);
  cublasDestroy(cublas);
}
#endif // RLPT_TEST_LM_HEAD

TEST_CASE_TEMPLATE("device top-k / top-p support, logprobs and gradients match the host", T, float, rlpt::bf16) {
  lt::rng g(66);
  const index_t n = 24, v = 5003;
  auto x = lt::random_logits<T>(g, static_cast<std::size_t>(n * v), 2.5);
  for (index_t j = 0; j < v; j += 5) x[static_cast<std::size_t>(3 * v + j)] = T(1.25f); // ties in row 3
  std::vector<index_t> t(static_cast<std::size_t>(n));
  for (index_t r = 0; r < n; ++r) { // the row's argmax: inside every support
    index_t best = 0;
    for (index_t j = 1; j < v; ++j)
      best = static_cast<float>(x[static_cast<std::size_t>(r * v + j)]) >
                     static_cast<float>(x[static_cast<std::size_t>(r * v + best)])
                 ? j
                 : best;
    t[static_cast<std::size_t>(r)] = best;
  }
  t[5] = -100;
  for (const auto& o :
       {rlpt::logprob_options{.temperature = 0.7f, .top_k = 40},
        rlpt::logprob_options{.temperature = 1.2f, .top_p = 0.9f}, rlpt::logprob_options{.top_k = 700, .top_p = 0.6f},
        rlpt::logprob_options{.min_p = 0.2f}, rlpt::logprob_options{.temperature = 0.9f, .top_p = 0.8f, .min_p = 0.05f},
        rlpt::logprob_options{.top_k = 300, .top_p = 0.7f, .min_p = 0.1f, .min_p_order = rlpt::min_p_order::last}}) {
    std::vector<float> hl(n), he(n), hs(n), hthr(n);
    std::vector<index_t> htie(n);
    std::vector<rlpt::mask_t> hk(static_cast<std::size_t>(n * v));
    const rlpt::view2d<const T> hx(x.data(), n, v);
    rlpt::logprob_entropy(hx, t,
                          {.logp = hl,
                           .entropy = he,
                           .saved = {.lse = hs, .threshold = hthr, .tie_last = htie},
                           .kept = rlpt::view2d<rlpt::mask_t>(hk.data(), n, v)},
                          o);
    dev_buffer<T> dx(x);
    dev_buffer<index_t> dt(t), dtie(n), cnt(3);
    dev_buffer<float> lp(n), en(n), ls(n), thr(n);
    dev_buffer<rlpt::mask_t> kept(static_cast<std::size_t>(n * v));
    const rlpt::device_view2d<const T> xv(dx.data(), n, v);
    rlpt::logprob_entropy(xv, dt.cview(),
                          {.logp = lp.view(),
                           .entropy = en.view(),
                           .lse = ls.view(),
                           .counters = cnt.view(),
                           .threshold = thr.view(),
                           .tie_last = dtie.view(),
                           .kept = rlpt::device_view2d<rlpt::mask_t>(kept.data(), n, v)},
                          o, nullptr);
    INFO("top_k " << o.top_k << " top_p " << o.top_p << " min_p " << o.min_p);
    CHECK(kept.get() == hk);
    CHECK(dtie.get() == htie);
    const auto a = lp.get(), b = en.get(), c = thr.get();
    CHECK(c == hthr);
    RLPT_CHECK_CLOSE(a, hl, 1e-5, 1e-4);
    RLPT_CHECK_CLOSE(b, he, 1e-5, 1e-4);
    CHECK(cnt.get() == std::vector<index_t>{0, 0, 0});
    const auto dl = g.normals<float>(static_cast<std::size_t>(n)), dh = g.normals<float>(static_cast<std::size_t>(n));
    std::vector<T> hg(x.size());
    rlpt::logprob_entropy_backward(
        hx, t, {.dlogp = dl, .dentropy = dh, .entropy = he, .saved = {.lse = hs, .threshold = hthr, .tie_last = htie}},
        rlpt::view2d<T>(hg.data(), n, v), o);
    dev_buffer<float> ddl(dl), ddh(dh);
    dev_buffer<T> dg(x.size());
    rlpt::logprob_entropy_backward(xv, dt.cview(),
                                   {.dlogp = ddl.cview(),
                                    .dentropy = ddh.cview(),
                                    .logp = lp.cview(),
                                    .entropy = en.cview(),
                                    .saved = {.lse = ls.cview(), .threshold = thr.cview(), .tie_last = dtie.cview()}},
                                   rlpt::device_view2d<T>(dg.data(), n, v), o, nullptr);
    const auto got = as_floats(dg.get()), want = as_floats(hg);
    RLPT_CHECK_CLOSE(got, want, grad_rel<T>(), 1e-7);
  }
}

TEST_CASE("device counters report targets out of range and unusable rows") {
  std::vector<float> x(4 * 100, 0.5f);
  x[2 * 100 + 3] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<index_t> t = {1, 100, 2, -100};
  dev_buffer<float> dx(x), lp(4);
  dev_buffer<index_t> dt(t), cnt(3);
  rlpt::logprob_entropy(rlpt::device_view2d<const float>(dx.data(), 4, 100), dt.cview(),
                        {.logp = lp.view(), .counters = cnt.view()}, {}, nullptr);
  const auto c = cnt.get();
  CHECK(c[0] == 1);
  CHECK(c[1] == 1);
  const auto l = lp.get();
  CHECK(l[0] == doctest::Approx(-std::log(100.0)).epsilon(1e-5));
  CHECK(std::isnan(l[1]));
  CHECK(std::isnan(l[2]));
  CHECK(l[3] == 0.0f);
  CHECK(c[2] == 0);
  dev_buffer<float> grad(400);
  RLPT_CHECK_ERROR(rlpt::logprob_entropy_fused(rlpt::device_view2d<const float>(dx.data(), 4, 100), dt.cview(),
                                               {.logp = lp.view()}, rlpt::device_view2d<float>(grad.data(), 4, 100),
                                               logprob_gpu_test::ppo_like_grad{lp.data()}, {.top_p = 0.9f}, nullptr),
                   "rlpt.logprob.unsupported", "top_p 0.9", "fused forward+backward");
}

// ---------------------------------------------------------------------------------------------
// Device cases of the fixes whose arithmetic tests/logprob/test_device_math.cpp pins on the host.

TEST_CASE("device: peaked rows, top_k = 1 and tiny top_p give finite logprobs (issue 16 item 1)") {
  const index_t n = 64, v = 3001;
  lt::rng g(80);
  auto x = lt::random_logits<float>(g, static_cast<std::size_t>(n * v), 1.0);
  std::vector<index_t> t(static_cast<std::size_t>(n));
  for (index_t r = 0; r < n; ++r) { // a peak 30-60 nats above the rest, at a varied magnitude
    const index_t j = (r * 37) % v;
    x[static_cast<std::size_t>(r * v + j)] = 30.0f + static_cast<float>(r) * 0.71f + static_cast<float>(r % 7) * 100.0f;
    t[static_cast<std::size_t>(r)] = j;
  }
  dev_buffer<float> dx(x), lp(n), en(n);
  dev_buffer<index_t> dt(t), cnt(3);
  const rlpt::device_view2d<const float> xv(dx.data(), n, v);
  for (const auto& o : {rlpt::logprob_options{}, rlpt::logprob_options{.temperature = 0.9f, .top_k = 1},
                        rlpt::logprob_options{.top_p = 1e-6f}}) {
    INFO("top_k " << o.top_k << " top_p " << o.top_p);
    rlpt::logprob_entropy(xv, dt.cview(), {.logp = lp.view(), .entropy = en.view(), .counters = cnt.view()}, o,
                          nullptr);
    CHECK(cnt.get() == std::vector<index_t>{0, 0, 0});
    for (const float l : lp.get()) CHECK(l == doctest::Approx(0.0).epsilon(1e-5));
    for (const float h : en.get()) CHECK(h == doctest::Approx(0.0).epsilon(1e-5));
  }
  // vocab-parallel finish and the lm-head fold share the fixed check
  dev_buffer<float> comm(static_cast<std::size_t>(4 * n)), lmax(n);
  rlpt::vocab_parallel_local(xv, dt.cview(), {.begin = 0, .vocab = v}, comm.view(), lmax.view(), {}, nullptr);
  rlpt::vocab_parallel_rebase(comm.view(), lmax.cview(), nullptr);
  rlpt::vocab_parallel_finish(comm.cview(), dt.cview(), {.logp = lp.view(), .counters = cnt.view()}, {}, nullptr);
  CHECK(cnt.get() == std::vector<index_t>{0, 0, 0});
  for (const float l : lp.get()) CHECK(l == doctest::Approx(0.0).epsilon(1e-5));
}

TEST_CASE("device: a NaN next to -inf logits poisons its row (issue 16 item 2)") {
  const index_t v = 4099;
  std::vector<float> x(static_cast<std::size_t>(2 * v), 0.25f);
  for (index_t j = 0; j < 8; ++j) x[static_cast<std::size_t>(j)] = -std::numeric_limits<float>::infinity();
  x[3] = std::numeric_limits<float>::quiet_NaN(); // thread 0's first vector: NaN among -inf
  const std::vector<index_t> t = {100, 100};
  dev_buffer<float> dx(x), lp(2), en(2);
  dev_buffer<index_t> dt(t), cnt(3);
  rlpt::logprob_entropy(rlpt::device_view2d<const float>(dx.data(), 2, v), dt.cview(),
                        {.logp = lp.view(), .entropy = en.view(), .counters = cnt.view()}, {.temperature = 0.7f},
                        nullptr);
  const auto l = lp.get(), h = en.get();
  CHECK(std::isnan(l[0]));
  CHECK(std::isnan(h[0]));
  CHECK(std::isfinite(l[1]));
  CHECK(cnt.get()[0] == 1);
}

TEST_CASE_TEMPLATE("device: in-place backward with top-k decides from the forward's logp (issue 16 item 3)", T, float,
                   rlpt::bf16) {
  // V spans several column chunks of the backward grid (256 threads x 4 vectors each)
  const index_t n = 12, v = 40000;
  lt::rng g(81);
  auto x = lt::random_logits<T>(g, static_cast<std::size_t>(n * v), 2.0);
  for (auto& e : x) e = T(static_cast<float>(e) - 10.0f); // a gradient written over x[target] would look kept
  std::vector<index_t> t(static_cast<std::size_t>(n));
  for (index_t r = 0; r < n; ++r) t[static_cast<std::size_t>(r)] = (r * 3331 + 17) % v; // mostly outside the top-50
  const rlpt::logprob_options o{.temperature = 0.8f, .top_k = 50};
  dev_buffer<T> dx(x), out_of_place(x.size()), inplace(x);
  dev_buffer<index_t> dt(t), cnt(3), tie(n);
  dev_buffer<float> lp(n), en(n), ls(n), thr(n);
  const rlpt::device_view2d<const T> xv(dx.data(), n, v);
  rlpt::logprob_entropy(xv, dt.cview(),
                        {.logp = lp.view(),
                         .entropy = en.view(),
                         .lse = ls.view(),
                         .counters = cnt.view(),
                         .threshold = thr.view(),
                         .tie_last = tie.view()},
                        o, nullptr);
  CHECK(cnt.get()[2] > 0); // some targets were dropped
  const auto dl = g.normals<float>(static_cast<std::size_t>(n)), dh = g.normals<float>(static_cast<std::size_t>(n));
  dev_buffer<float> ddl(dl), ddh(dh);
  const rlpt::device_logprob_backward_inputs in{
      .dlogp = ddl.cview(),
      .dentropy = ddh.cview(),
      .logp = lp.cview(),
      .entropy = en.cview(),
      .saved = {.lse = ls.cview(), .threshold = thr.cview(), .tie_last = tie.cview()}};
  rlpt::logprob_entropy_backward(xv, dt.cview(), in, rlpt::device_view2d<T>(out_of_place.data(), n, v), o, nullptr);
  const rlpt::device_view2d<T> w(inplace.data(), n, v);
  rlpt::logprob_entropy_backward(rlpt::device_view2d<const T>(w), dt.cview(), in, w, o, nullptr);
  const auto a = out_of_place.get(), b = inplace.get();
  CHECK(std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0);
  // and the host's gradient, decided from the logits it reads before writing
  std::vector<T> hg(x.size());
  const auto hlp = lp.get(), hen = en.get(), hls = ls.get(), hthr = thr.get();
  const auto htie = tie.get();
  rlpt::logprob_entropy_backward(
      rlpt::view2d<const T>(x.data(), n, v), t,
      {.dlogp = dl, .dentropy = dh, .entropy = hen, .saved = {.lse = hls, .threshold = hthr, .tie_last = htie}},
      rlpt::view2d<T>(hg.data(), n, v),
      {.temperature = 0.8f, .top_k = 50, .on_dropped = rlpt::dropped_target::neg_inf});
  const auto got = as_floats(a), want = as_floats(hg);
  RLPT_CHECK_CLOSE(got, want, grad_rel<T>(), 1e-7);
}

TEST_CASE("device: a target outside every vocab-parallel shard is NaN and counted (issue 16 item 4)") {
  const index_t n = 6, v = 300;
  lt::rng g(82);
  const auto x = lt::random_logits<float>(g, static_cast<std::size_t>(n * v));
  const std::vector<index_t> t = {5, 300, -7, -100, 299, 100000};
  dev_buffer<float> dx(x);
  dev_buffer<index_t> dt(t);
  std::vector<std::unique_ptr<dev_buffer<float>>> comm, lmax;
  for (int q = 0; q < 2; ++q) {
    comm.push_back(std::make_unique<dev_buffer<float>>(static_cast<std::size_t>(4 * n)));
    lmax.push_back(std::make_unique<dev_buffer<float>>(static_cast<std::size_t>(n)));
    rlpt::vocab_parallel_local(rlpt::device_view2d<const float>(dx.data() + q * 150, n, 150, v), dt.cview(),
                               {.begin = q * 150, .vocab = v}, comm.back()->view(), lmax.back()->view(), {}, nullptr);
  }
  const auto c0 = comm[0]->get(), c1 = comm[1]->get();
  std::vector<float> merged(static_cast<std::size_t>(4 * n));
  const auto l0 = lmax[0]->get(), l1 = lmax[1]->get();
  for (index_t r = 0; r < n; ++r) {
    const auto i = static_cast<std::size_t>(r);
    const float m = std::max(c0[i], c1[i]);
    const rlpt::lse_state a = rlpt::lse_rebase({l0[i], c0[n + i], c0[2 * n + i]}, m);
    const rlpt::lse_state b = rlpt::lse_rebase({l1[i], c1[n + i], c1[2 * n + i]}, m);
    merged[i] = m;
    merged[static_cast<std::size_t>(n) + i] = a.s + b.s;
    merged[static_cast<std::size_t>(2 * n) + i] = a.a + b.a;
    merged[static_cast<std::size_t>(3 * n) + i] =
        c0[static_cast<std::size_t>(3 * n) + i] + c1[static_cast<std::size_t>(3 * n) + i];
  }
  dev_buffer<float> dm(merged), lp(n);
  dev_buffer<index_t> cnt(3);
  rlpt::vocab_parallel_finish(dm.cview(), dt.cview(), {.logp = lp.view(), .counters = cnt.view()}, {}, nullptr);
  const auto l = lp.get();
  CHECK(std::isfinite(l[0]));
  CHECK(std::isnan(l[1]));
  CHECK(std::isnan(l[2]));
  CHECK(l[3] == 0.0f);
  CHECK(std::isfinite(l[4]));
  CHECK(std::isnan(l[5]));
  CHECK(cnt.get() == std::vector<index_t>{0, 3, 0});
}

TEST_CASE("device: fused and plain forwards give the same bits at every V (issue 16 item 5)") {
  lt::rng g(83);
  for (const index_t v : {1000, 5003, 20001, 40000}) {
    const index_t n = 40;
    auto c = make_case<rlpt::bf16>(g, n, v, 0);
    dev_buffer<rlpt::bf16> dx(c.x), grad(c.x.size());
    dev_buffer<index_t> dt(c.t);
    dev_buffer<float> lp(n), en(n), ls(n), lp2(n), en2(n), ls2(n), adv(g.normals<float>(static_cast<std::size_t>(n)));
    const rlpt::device_view2d<const rlpt::bf16> x(dx.data(), n, v);
    rlpt::logprob_entropy_fused(x, dt.cview(), {.logp = lp.view(), .entropy = en.view(), .lse = ls.view()},
                                rlpt::device_view2d<rlpt::bf16>(grad.data(), n, v),
                                logprob_gpu_test::ppo_like_grad{adv.data()}, {.temperature = 0.7f}, nullptr);
    rlpt::logprob_entropy(x, dt.cview(), {.logp = lp2.view(), .entropy = en2.view(), .lse = ls2.view()},
                          {.temperature = 0.7f}, nullptr);
    INFO("V " << v);
    const auto a = lp.get(), b = lp2.get(), e1 = en.get(), e2 = en2.get(), s1 = ls.get(), s2 = ls2.get();
    CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
    CHECK(std::memcmp(e1.data(), e2.data(), e1.size() * 4) == 0);
    CHECK(std::memcmp(s1.data(), s2.data(), s1.size() * 4) == 0);
  }
}

TEST_CASE("device: logits are divided by T and logprobs keep their precision at |logit| ~ 1e4 (issue 19)") {
  const index_t n = 64, v = 2;
  const float temp = 0.7f;
  std::vector<float> x;
  for (float e = 1.0f; static_cast<index_t>(x.size()) < 2 * n; e = std::nextafter(e, 2.0f))
    if (e / temp != e * (1.0f / temp)) {
      x.push_back(e);
      x.push_back(-1.0f);
    }
  const std::vector<index_t> t(static_cast<std::size_t>(n), 0);
  dev_buffer<float> dx(x), lp(n), ls(n), thr(n);
  dev_buffer<index_t> dt(t), tie(n);
  rlpt::logprob_entropy(rlpt::device_view2d<const float>(dx.data(), n, v), dt.cview(),
                        {.logp = lp.view(), .lse = ls.view(), .threshold = thr.view(), .tie_last = tie.view()},
                        {.temperature = temp, .top_k = 1}, nullptr);
  const auto th = thr.get();
  for (index_t r = 0; r < n; ++r) CHECK(th[static_cast<std::size_t>(r)] == x[static_cast<std::size_t>(2 * r)] / temp);
  // precision: rows around 1e4, the likeliest token scored, against fp64
  lt::rng g(84);
  const index_t rows = 32, cols = 5000;
  std::vector<float> big(static_cast<std::size_t>(rows * cols));
  for (auto& e : big) e = 1.0e4f + static_cast<float>(g.normal()) * 2.0f;
  std::vector<index_t> tg(static_cast<std::size_t>(rows));
  std::vector<double> want;
  for (index_t r = 0; r < rows; ++r) {
    const float* row = big.data() + r * cols;
    index_t best = 0;
    for (index_t j = 1; j < cols; ++j) best = row[j] > row[best] ? j : best;
    tg[static_cast<std::size_t>(r)] = best;
    std::vector<double> z(static_cast<std::size_t>(cols));
    for (index_t j = 0; j < cols; ++j) z[static_cast<std::size_t>(j)] = static_cast<double>(row[j] / temp);
    want.push_back(lt::reference_row(z, 1.0, best).logp);
  }
  dev_buffer<float> db(big), blp(rows);
  dev_buffer<index_t> dtg(tg);
  rlpt::logprob_entropy(rlpt::device_view2d<const float>(db.data(), rows, cols), dtg.cview(), {.logp = blp.view()},
                        {.temperature = temp}, nullptr);
  const auto got_big = blp.get();
  RLPT_CHECK_CLOSE(got_big, want, 2e-5, 1e-6);
}

#ifdef RLPT_TEST_LM_HEAD
TEST_CASE("device: the lm-head gives the caller's cuBLAS handle back on its stream, and its folds may overlap the "
          "GEMMs (issue 16 items 7, 8)") {
  lt::rng g(85);
  const index_t n = 200, d = 64, v = 3000;
  const auto h = lt::random_logits<rlpt::bf16>(g, static_cast<std::size_t>(n * d), 1.0);
  const auto w = lt::random_logits<rlpt::bf16>(g, static_cast<std::size_t>(v * d), 0.2);
  std::vector<index_t> t(static_cast<std::size_t>(n));
  for (auto& y : t) y = g.integer(0, v - 1);
  cublasHandle_t cublas = nullptr;
  REQUIRE(cublasCreate(&cublas) == CUBLAS_STATUS_SUCCESS);
  cudaStream_t mine = nullptr, call = nullptr, folds = nullptr;
  RLPT_CUDA_CHECK(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  RLPT_CUDA_CHECK(cudaStreamCreateWithFlags(&call, cudaStreamNonBlocking));
  RLPT_CUDA_CHECK(cudaStreamCreateWithFlags(&folds, cudaStreamNonBlocking));
  REQUIRE(cublasSetStream(cublas, mine) == CUBLAS_STATUS_SUCCESS);
  dev_buffer<rlpt::bf16> dh(h), dw(w);
  dev_buffer<index_t> dt(t);
  const rlpt::device_view2d<const rlpt::bf16> xh(dh.data(), n, d), xw(dw.data(), v, d);
  const auto run = [&](cudaStream_t fold_stream, dev_buffer<float>& lp, dev_buffer<float>& en) {
    const rlpt::device_lm_head_options o{
        .temperature = 0.9f, .token_tile = 64, .vocab_tile = 512, .fold_stream = fold_stream};
    rlpt::workspace ws;
    rlpt::fused_lm_head_logprob(ws, xh, xw, dt.cview(), {}, cublas, o, call);
    dev_buffer<char> wsb(ws.bytes);
    ws.data = wsb.data();
    rlpt::fused_lm_head_logprob(ws, xh, xw, dt.cview(), {.logp = lp.view(), .entropy = en.view()}, cublas, o, call);
    RLPT_CUDA_CHECK(cudaStreamSynchronize(call));
  };
  dev_buffer<float> lp1(n), en1(n), lp2(n), en2(n);
  run(nullptr, lp1, en1);
  cudaStream_t now = nullptr;
  REQUIRE(cublasGetStream(cublas, &now) == CUBLAS_STATUS_SUCCESS);
  CHECK(now == mine);
  run(folds, lp2, en2);
  REQUIRE(cublasGetStream(cublas, &now) == CUBLAS_STATUS_SUCCESS);
  CHECK(now == mine);
  const auto a = lp1.get(), b = lp2.get(), c = en1.get(), e = en2.get();
  CHECK(std::memcmp(a.data(), b.data(), a.size() * 4) == 0); // same folds in the same order
  CHECK(std::memcmp(c.data(), e.data(), c.size() * 4) == 0);
  // and the host lm-head (same division by T)
  std::vector<float> hl(n), he(n);
  rlpt::fused_lm_head_logprob(rlpt::view2d<const rlpt::bf16>(h.data(), n, d),
                              rlpt::view2d<const rlpt::bf16>(w.data(), v, d), t, {.logp = hl, .entropy = he},
                              {.temperature = 0.9f});
  RLPT_CHECK_CLOSE(a, hl, 1e-4, 1e-3);
  cublasDestroy(cublas);
  cudaStreamDestroy(mine);
  cudaStreamDestroy(call);
  cudaStreamDestroy(folds);
}
#endif // RLPT_TEST_LM_HEAD
