// SPDX-License-Identifier: Apache-2.0
// Fused lm-head (hidden × weightᵀ -> logprob/entropy, never storing the logits) against an
// fp64 reference, finite differences for grad_hidden and grad_weight, bitwise batch
// invariance, and vocab-parallel shards of the head.
#include <rlpt/logprob.hpp>
#include <rlpt/logprob/lm_head.hpp>
#include <rlpt/core/thread_pool.hpp>

#include "fake_group.hpp"
#include "reference.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <thread>
#include <vector>

using rlpt::index_t;
namespace lt = rlpt::test;

namespace {

template <class T> double as_double(T x) {
  if constexpr (std::is_same_v<T, double>) {
    return x;
  } else {
    return static_cast<double>(static_cast<float>(x));
  }
}

template <class T> std::vector<T> random_matrix(lt::rng& g, index_t rows, index_t cols, double sd) {
  return lt::random_logits<T>(g, static_cast<std::size_t>(rows * cols), sd);
}

// fp64 logits of row r: Σ_k h[r,k]·w[j,k] / T, then the reference softmax statistics.
template <class H, class W>
std::vector<lt::ref_row> reference_head(const std::vector<H>& h, const std::vector<W>& w, index_t n, index_t d,
                                        index_t v, const std::vector<index_t>& t, double temp) {
  std::vector<lt::ref_row> out;
  for (index_t r = 0; r < n; ++r) {
    std::vector<double> x(static_cast<std::size_t>(v));
    for (index_t j = 0; j < v; ++j) {
      double acc = 0;
      for (index_t k = 0; k < d; ++k) acc += as_double(h[r * d + k]) * as_double(w[j * d + k]);
      x[static_cast<std::size_t>(j)] = acc;
    }
    out.push_back(
        lt::reference_row(x, temp, t[static_cast<std::size_t>(r)] == -100 ? -1 : t[static_cast<std::size_t>(r)]));
  }
  return out;
}

} // namespace

TEST_CASE_TEMPLATE("fused lm-head forward matches the fp64 reference", T, float, rlpt::bf16) {
  lt::rng g(50);
  const index_t n = 203, d = 64, v = 2500; // two token tiles, three vocabulary slabs (last partial)
  const auto h = random_matrix<T>(g, n, d, 1.0), w = random_matrix<T>(g, v, d, 0.3);
  std::vector<index_t> t(n);
  for (auto& x : t) x = g.integer(0, v - 1);
  t[7] = -100;
  std::vector<float> logp(n), ent(n), lse(n);
  std::vector<rlpt::mask_t> scored(n);
  const auto st = rlpt::fused_lm_head_logprob(
      rlpt::view2d<const T>(h.data(), n, d), rlpt::view2d<const T>(w.data(), v, d), t,
      {.logp = logp, .entropy = ent, .saved = {.lse = lse}, .scored = scored}, {.temperature = 0.8f});
  CHECK(st.scored == n - 1);
  CHECK(st.ignored == 1);
  const auto ref = reference_head(h, w, n, d, v, t, 0.8);
  std::vector<double> wl, we, wlse;
  for (const auto& r : ref) {
    wl.push_back(r.logp);
    we.push_back(r.entropy);
    wlse.push_back(r.lse);
  }
  RLPT_CHECK_CLOSE(logp, wl, 1e-4, 1e-4);
  RLPT_CHECK_CLOSE(ent, we, 1e-4, 1e-4);
  RLPT_CHECK_CLOSE(lse, wlse, 1e-4, 1e-4);
  CHECK(scored[7] == 0);
  CHECK(logp[7] == 0.0f);
}

TEST_CASE("fused lm-head results are bitwise independent of N, row position and threads") {
  lt::rng g(51);
  const index_t d = 40, v = 1300, pool_n = 5;
  const auto pool = random_matrix<rlpt::bf16>(g, pool_n, d, 1.0);
  const auto w = random_matrix<rlpt::bf16>(g, v, d, 0.4);
  const std::vector<index_t> pool_t = {3, 999, 1299, 0, 640};
  const auto run = [&](index_t n, index_t shift, unsigned threads) {
    std::vector<rlpt::bf16> h(static_cast<std::size_t>(n * d));
    std::vector<index_t> t(n);
    for (index_t i = 0; i < n; ++i) {
      const index_t src = (i * 3 + shift) % pool_n;
      std::memcpy(h.data() + i * d, pool.data() + src * d, sizeof(rlpt::bf16) * d);
      t[i] = pool_t[static_cast<std::size_t>(src)];
    }
    rlpt::thread_pool tp(threads);
    std::vector<float> logp(n), ent(n);
    rlpt::fused_lm_head_logprob(rlpt::view2d<const rlpt::bf16>(h.data(), n, d),
                                rlpt::view2d<const rlpt::bf16>(w.data(), v, d), t, {.logp = logp, .entropy = ent},
                                {.token_tile = 48, .vocab_tile = 512}, {threads > 1 ? &tp : nullptr});
    std::vector<std::pair<index_t, std::pair<float, float>>> out;
    for (index_t i = 0; i < n; ++i) out.push_back({(i * 3 + shift) % pool_n, {logp[i], ent[i]}});
    return out;
  };
  std::vector<std::pair<float, float>> canon;
  for (index_t r = 0; r < pool_n; ++r) canon.push_back(run(1, r, 1)[0].second);
  for (const index_t n : {2, 47, 48, 49, 150})
    for (const unsigned threads : {1u, 2u})
      for (const auto& [src, val] : run(n, n % pool_n, threads)) {
        INFO("N " << n << " threads " << threads << " row " << src);
        CHECK(std::memcmp(&val.first, &canon[static_cast<std::size_t>(src)].first, 4) == 0);
        CHECK(std::memcmp(&val.second, &canon[static_cast<std::size_t>(src)].second, 4) == 0);
      }
}

TEST_CASE("fused lm-head gradients equal central finite differences of the fp64 forward") {
  lt::rng g(52);
  const index_t n = 3, d = 8, v = 37;
  const auto h = random_matrix<double>(g, n, d, 1.0), w = random_matrix<double>(g, v, d, 0.5);
  const std::vector<index_t> t = {4, -100, 36};
  const double temp = 0.9;
  const std::vector<double> dl = {0.7, 0.4, -1.1}, dh = {-0.3, 0.8, 0.5};
  const auto loss = [&](const std::vector<double>& hh, const std::vector<double>& ww) {
    double f = 0;
    const auto rows = reference_head(hh, ww, n, d, v, t, temp);
    for (index_t r = 0; r < n; ++r)
      f += (t[static_cast<std::size_t>(r)] == -100
                ? 0.0
                : dl[static_cast<std::size_t>(r)] * rows[static_cast<std::size_t>(r)].logp) +
           dh[static_cast<std::size_t>(r)] * rows[static_cast<std::size_t>(r)].entropy;
    return f;
  };
  const auto fd_h = lt::finite_difference([&](const std::vector<double>& x) { return loss(x, w); }, h);
  const auto fd_w = lt::finite_difference([&](const std::vector<double>& x) { return loss(h, x); }, w);

  std::vector<float> logp(n), ent(n), lse(n);
  const rlpt::view2d<const double> hv(h.data(), n, d), wv(w.data(), v, d);
  const rlpt::lm_head_options o{.temperature = static_cast<float>(temp), .vocab_tile = 16};
  rlpt::fused_lm_head_logprob(hv, wv, t, {.logp = logp, .entropy = ent, .saved = {.lse = lse}}, o);
  std::vector<float> gh(static_cast<std::size_t>(n * d)), gw(static_cast<std::size_t>(v * d));
  const std::vector<float> dlf(dl.begin(), dl.end()), dhf(dh.begin(), dh.end());
  rlpt::fused_lm_head_backward(hv, wv, t, dlf, dhf, ent, lse, rlpt::view2d<float>(gh.data(), n, d),
                               rlpt::view2d<float>(gw.data(), v, d), o);
  RLPT_CHECK_CLOSE(gh, fd_h, 1e-3, 1e-5);
  RLPT_CHECK_CLOSE(gw, fd_w, 1e-3, 1e-5);
}

TEST_CASE_TEMPLATE("fused lm-head backward matches the analytic fp64 gradient across tiles", T, float, rlpt::bf16) {
  lt::rng g(53);
  const index_t n = 250, d = 24, v = 1100;
  const auto h = random_matrix<T>(g, n, d, 1.0), w = random_matrix<T>(g, v, d, 0.5);
  std::vector<index_t> t(n);
  for (auto& x : t) x = g.integer(0, v - 1);
  t[3] = -100;
  const auto dl = g.normals<float>(n), dh = g.normals<float>(n);
  std::vector<float> logp(n), ent(n), lse(n);
  const rlpt::view2d<const T> hv(h.data(), n, d), wv(w.data(), v, d);
  rlpt::fused_lm_head_logprob(hv, wv, t, {.logp = logp, .entropy = ent, .saved = {.lse = lse}});
  std::vector<float> gh(static_cast<std::size_t>(n * d), 3.0f), gw(static_cast<std::size_t>(v * d), 3.0f);
  rlpt::thread_pool tp(2);
  rlpt::fused_lm_head_backward(hv, wv, t, dl, dh, ent, lse, rlpt::view2d<float>(gh.data(), n, d),
                               rlpt::view2d<float>(gw.data(), v, d), {.vocab_tile = 256}, {&tp});
  // reference: dz = analytic dlogits per row, then dz·W and dzᵀ·H in fp64
  std::vector<double> want_gh(static_cast<std::size_t>(n * d), 0.0), want_gw(static_cast<std::size_t>(v * d), 0.0);
  for (index_t r = 0; r < n; ++r) {
    std::vector<double> x(static_cast<std::size_t>(v));
    for (index_t j = 0; j < v; ++j) {
      double acc = 0;
      for (index_t k = 0; k < d; ++k)
        acc += static_cast<double>(static_cast<float>(h[r * d + k])) *
               static_cast<double>(static_cast<float>(w[j * d + k]));
      x[static_cast<std::size_t>(j)] = acc;
    }
    const auto dz = lt::reference_grad(
        x, 1.0, t[static_cast<std::size_t>(r)] == -100 ? -1 : t[static_cast<std::size_t>(r)], dl[r], dh[r]);
    for (index_t j = 0; j < v; ++j)
      for (index_t k = 0; k < d; ++k) {
        want_gh[r * d + k] += dz[static_cast<std::size_t>(j)] * static_cast<double>(static_cast<float>(w[j * d + k]));
        want_gw[j * d + k] += dz[static_cast<std::size_t>(j)] * static_cast<double>(static_cast<float>(h[r * d + k]));
      }
  }
  RLPT_CHECK_CLOSE(gh, want_gh, 2e-4, 2e-5);
  RLPT_CHECK_CLOSE(gw, want_gw, 2e-4, 2e-5);
  // accumulate mode adds
  auto gh2 = gh;
  rlpt::fused_lm_head_backward(hv, wv, t, dl, dh, ent, lse, rlpt::view2d<float>(gh2.data(), n, d), {},
                               {.vocab_tile = 256}, {&tp}, {}, true);
  for (std::size_t i = 0; i < gh.size(); ++i) CHECK(gh2[i] == doctest::Approx(2.0 * gh[i]).epsilon(1e-6));
}

TEST_CASE("a vocab-parallel fused head over uneven shards equals the whole head") {
  lt::rng g(54);
  const index_t n = 60, d = 16, v = 999;
  const auto h = random_matrix<rlpt::bf16>(g, n, d, 1.0), w = random_matrix<rlpt::bf16>(g, v, d, 0.5);
  std::vector<index_t> t(n);
  for (auto& x : t) x = g.integer(0, v - 1);
  t[10] = -100;
  const auto dl = g.normals<float>(n), dh = g.normals<float>(n);
  const rlpt::view2d<const rlpt::bf16> hv(h.data(), n, d);
  std::vector<float> want_lp(n), want_ent(n), want_lse(n), want_gh(static_cast<std::size_t>(n * d)),
      want_gw(static_cast<std::size_t>(v * d));
  rlpt::fused_lm_head_logprob(hv, rlpt::view2d<const rlpt::bf16>(w.data(), v, d), t,
                              {.logp = want_lp, .entropy = want_ent, .saved = {.lse = want_lse}});
  rlpt::fused_lm_head_backward(hv, rlpt::view2d<const rlpt::bf16>(w.data(), v, d), t, dl, dh, want_ent, want_lse,
                               rlpt::view2d<float>(want_gh.data(), n, d), rlpt::view2d<float>(want_gw.data(), v, d));
  const std::vector<index_t> cut = {0, 100, 612, 999};
  const int k = 3;
  lt::fake_group group(k);
  std::vector<std::vector<float>> lp(k, std::vector<float>(n)),
      gh(k, std::vector<float>(static_cast<std::size_t>(n * d)));
  std::vector<float> gw(static_cast<std::size_t>(v * d));
  std::vector<std::thread> ranks;
  for (int q = 0; q < k; ++q)
    ranks.emplace_back([&, q] {
      const index_t b = cut[static_cast<std::size_t>(q)], e = cut[static_cast<std::size_t>(q) + 1];
      const rlpt::view2d<const rlpt::bf16> wl(w.data() + b * d, e - b, d);
      const rlpt::vocab_shard shard{.begin = b, .vocab = v};
      std::vector<float> comm(static_cast<std::size_t>(4 * n)), ent(n), lse(n);
      auto& mine = lp[static_cast<std::size_t>(q)];
      rlpt::fused_lm_head_local(hv, wl, t, shard, comm, mine);
      group.allreduce(q, rlpt::view<float>(comm).subview(0, n), rlpt::reduce_op::max);
      rlpt::vocab_parallel_rebase(comm, mine);
      group.allreduce(q, rlpt::view<float>(comm).subview(n, 3 * n), rlpt::reduce_op::sum);
      rlpt::vocab_parallel_finish(comm, t, {.logp = mine, .entropy = ent, .saved = {.lse = lse}});
      rlpt::fused_lm_head_backward(hv, wl, t, dl, dh, ent, lse,
                                   rlpt::view2d<float>(gh[static_cast<std::size_t>(q)].data(), n, d),
                                   rlpt::view2d<float>(gw.data() + b * d, e - b, d), {}, {}, shard);
    });
  for (auto& th : ranks) th.join();
  for (int q = 0; q < k; ++q) RLPT_CHECK_CLOSE(lp[static_cast<std::size_t>(q)], want_lp, 1e-5, 1e-5);
  std::vector<float> gh_sum(static_cast<std::size_t>(n * d), 0.0f); // the caller's all-reduce of grad_hidden
  for (int q = 0; q < k; ++q)
    for (std::size_t i = 0; i < gh_sum.size(); ++i) gh_sum[i] += gh[static_cast<std::size_t>(q)][i];
  RLPT_CHECK_CLOSE(gh_sum, want_gh, 1e-4, 1e-6);
  RLPT_CHECK_CLOSE(gw, want_gw, 1e-4, 1e-6);
}

TEST_CASE("fused lm-head input errors") {
  lt::rng g(55);
  const auto h = random_matrix<float>(g, 4, 8, 1.0), w = random_matrix<float>(g, 10, 7, 1.0);
  const std::vector<index_t> t = {0, 1, 2, 3};
  std::vector<float> logp(4);
  RLPT_CHECK_ERROR(rlpt::fused_lm_head_logprob(rlpt::view2d<const float>(h.data(), 4, 8),
                                               rlpt::view2d<const float>(w.data(), 10, 7), t, {.logp = logp}),
                   "rlpt.logprob.shape_mismatch", "hidden is [4, 8]", "weight is [10, 7]");
  RLPT_CHECK_ERROR(rlpt::fused_lm_head_logprob(rlpt::view2d<const float>(h.data(), 4, 7),
                                               rlpt::view2d<const float>(w.data(), 10, 7), t, {.logp = logp},
                                               {.temperature = 0.0f}),
                   "rlpt.logprob.temperature", "got 0");
  const std::vector<index_t> bad = {0, 1, 10, 3};
  RLPT_CHECK_ERROR(rlpt::fused_lm_head_logprob(rlpt::view2d<const float>(h.data(), 4, 7),
                                               rlpt::view2d<const float>(w.data(), 10, 7), bad, {.logp = logp}),
                   "rlpt.logprob.target_out_of_range", "target 10 of row 2");
}
