// SPDX-License-Identifier: Apache-2.0
// Sampling-consistent scoring (temperature, top-k, top-p) against an explicit sort-based fp64
// reference, bitwise batch invariance, and the error contract.
#include <rlpt/logprob.hpp>
#include <rlpt/core/thread_pool.hpp>

#include "reference.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using rlpt::index_t;
namespace lt = rlpt::test;

namespace {

struct truncated_run {
  std::vector<float> logp, ent, lse, thr;
  std::vector<index_t> tie;
  std::vector<rlpt::mask_t> kept;
  rlpt::logprob_stats st;
};

template <class T>
truncated_run run_truncated(const std::vector<T>& x, index_t rows, index_t cols, const std::vector<index_t>& t,
                            const rlpt::logprob_options& o, const rlpt::host_executor& ex = {}) {
  truncated_run r;
  const auto n = static_cast<std::size_t>(rows);
  r.logp.resize(n);
  r.ent.resize(n);
  r.lse.resize(n);
  r.thr.resize(n);
  r.tie.resize(n);
  r.kept.resize(n * static_cast<std::size_t>(cols));
  r.st = rlpt::logprob_entropy(rlpt::view2d<const T>(x.data(), rows, cols), t,
                               {.logp = r.logp,
                                .entropy = r.ent,
                                .saved = {.lse = r.lse, .threshold = r.thr, .tie_last = r.tie},
                                .kept = rlpt::view2d<rlpt::mask_t>(r.kept.data(), rows, cols)},
                               o, ex);
  return r;
}

// Logits with many exact ties (a few distinct values), so cuts fall inside tie groups.
std::vector<float> tied_logits(lt::rng& g, std::size_t n) {
  std::vector<float> v(n);
  for (auto& e : v) e = static_cast<float>(g.integer(0, 6)) * 0.75f;
  return v;
}

void check_against_reference(const std::vector<float>& x, index_t rows, index_t cols, std::vector<index_t> t,
                             const rlpt::logprob_options& o) {
  const bool first = o.min_p_order == rlpt::min_p_order::first;
  // score only targets the reference keeps (dropped targets are tested separately)
  for (index_t r = 0; r < rows; ++r) {
    const auto ref = lt::reference_row(lt::to_double(x.data() + r * cols, cols), o.temperature, -1, o.top_k, o.top_p,
                                       o.min_p, first);
    for (index_t j = 0; j < cols; ++j)
      if (ref.kept[static_cast<std::size_t>(j)]) {
        t[static_cast<std::size_t>(r)] = j;
        if ((j + r) % 3 == 0) break;
      }
  }
  const auto run = run_truncated(x, rows, cols, t, o);
  CHECK(run.st.dropped == 0);
  for (index_t r = 0; r < rows; ++r) {
    const auto xd = lt::to_double(x.data() + r * cols, cols);
    const auto ref =
        lt::reference_row(xd, o.temperature, t[static_cast<std::size_t>(r)], o.top_k, o.top_p, o.min_p, first);
    INFO("row " << r << " top_k " << o.top_k << " top_p " << o.top_p << " min_p " << o.min_p << " first " << first
                << " T " << o.temperature);
    const std::vector<rlpt::mask_t> kept(run.kept.begin() + r * cols, run.kept.begin() + (r + 1) * cols);
    CHECK(kept == ref.kept);
    CHECK(run.logp[r] == doctest::Approx(ref.logp).epsilon(2e-5));
    CHECK(run.ent[r] == doctest::Approx(ref.entropy).epsilon(2e-5));
    CHECK(run.lse[r] == doctest::Approx(ref.lse).epsilon(2e-5));
  }
  // backward under the same support, from saved statistics and from scratch
  lt::rng g(99);
  const auto dl = g.normals<float>(static_cast<std::size_t>(rows)),
             dh = g.normals<float>(static_cast<std::size_t>(rows));
  std::vector<float> grad(x.size()), grad2(x.size());
  const rlpt::view2d<const float> xv(x.data(), rows, cols);
  auto lse = run.lse, thr = run.thr;
  auto tie = run.tie;
  rlpt::logprob_entropy_backward(
      xv, t,
      {.dlogp = dl, .dentropy = dh, .entropy = run.ent, .saved = {.lse = lse, .threshold = thr, .tie_last = tie}},
      rlpt::view2d<float>(grad.data(), rows, cols), o);
  rlpt::logprob_entropy_backward(xv, t, {.dlogp = dl, .dentropy = dh}, rlpt::view2d<float>(grad2.data(), rows, cols),
                                 o);
  CHECK(grad == grad2);
  for (index_t r = 0; r < rows; ++r) {
    const auto want =
        lt::reference_grad(lt::to_double(x.data() + r * cols, cols), o.temperature, t[static_cast<std::size_t>(r)],
                           dl[r], dh[r], o.top_k, o.top_p, o.min_p, first);
    const std::vector<double> got(grad.begin() + r * cols, grad.begin() + (r + 1) * cols);
    INFO("gradient row " << r);
    RLPT_CHECK_CLOSE(got, want, 1e-4, 1e-6);
  }
}

} // namespace

TEST_CASE("top-k keeps the k largest tempered logits and every tie with the k-th") {
  lt::rng g(10);
  const index_t rows = 6, cols = 700;
  const auto smooth = lt::random_logits<float>(g, rows * cols);
  const auto tied = tied_logits(g, rows * cols);
  std::vector<index_t> t(rows, 0);
  for (const index_t k : {1, 2, 5, 50, 699, 700, 5000}) {
    check_against_reference(smooth, rows, cols, t, {.temperature = 0.7f, .top_k = k});
    check_against_reference(tied, rows, cols, t, {.top_k = k});
  }
}

TEST_CASE("top-p keeps the nucleus of the top-k distribution, ties cut by column") {
  lt::rng g(11);
  const index_t rows = 5, cols = 1500;
  const auto smooth = lt::random_logits<float>(g, rows * cols, 2.0);
  const auto tied = tied_logits(g, rows * cols);
  std::vector<index_t> t(rows, 0);
  for (const float p : {0.013f, 0.37f, 0.81f, 0.9f, 0.999f}) {
    check_against_reference(smooth, rows, cols, t, {.temperature = 1.1f, .top_p = p});
    check_against_reference(tied, rows, cols, t, {.top_p = p});
    check_against_reference(smooth, rows, cols, t, {.temperature = 0.6f, .top_k = 40, .top_p = p});
    check_against_reference(tied, rows, cols, t, {.top_k = 300, .top_p = p});
  }
}

TEST_CASE("min-p keeps p >= min_p max p, before top-k/top-p (vLLM) or after them (SGLang, HF)") {
  lt::rng g(14);
  const index_t rows = 5, cols = 1200;
  const auto smooth = lt::random_logits<float>(g, rows * cols, 2.0);
  const auto tied = tied_logits(g, rows * cols);
  std::vector<index_t> t(rows, 0);
  for (const auto order : {rlpt::min_p_order::first, rlpt::min_p_order::last}) {
    for (const float mp : {0.001f, 0.05f, 0.3f, 0.9f, 1.0f}) {
      CAPTURE(mp);
      check_against_reference(smooth, rows, cols, t, {.temperature = 0.8f, .min_p = mp, .min_p_order = order});
      check_against_reference(tied, rows, cols, t, {.min_p = mp, .min_p_order = order});
      check_against_reference(smooth, rows, cols, t, {.top_k = 30, .min_p = mp, .min_p_order = order});
      check_against_reference(smooth, rows, cols, t,
                              {.temperature = 1.3f, .top_p = 0.7f, .min_p = mp, .min_p_order = order});
      check_against_reference(tied, rows, cols, t, {.top_k = 400, .top_p = 0.6f, .min_p = mp, .min_p_order = order});
      check_against_reference(smooth, rows, cols, t,
                              {.temperature = 0.6f, .top_k = 50, .top_p = 0.95f, .min_p = mp, .min_p_order = order});
    }
  }
}

TEST_CASE("min-p's order changes top-p's nucleus only, and its bound is exact to the float") {
  // masses relative to the max (column 1): e^-1, 1, e^-1.2, e^-3. min_p = 0.2 drops column 3.
  // top_p = 0.81: over min-p's three columns (total 1.669, vLLM) the first two reach 0.81 of it;
  // over all four (1.719, SGLang) they do not, so column 2 stays, and min-p then drops column 3.
  const std::vector<float> x = {0.0f, 1.0f, -0.2f, -2.0f};
  const std::vector<index_t> t = {1};
  using v = std::vector<rlpt::mask_t>;
  CHECK(run_truncated(x, 1, 4, t, rlpt::compat::vllm::sampled(1.0f, -1, 1.0f, 0.2f)).kept == v{1, 1, 1, 0});
  CHECK(run_truncated(x, 1, 4, t, rlpt::compat::sglang::sampled(1.0f, -1, 1.0f, 0.2f)).kept == v{1, 1, 1, 0});
  CHECK(run_truncated(x, 1, 4, t, rlpt::compat::vllm::sampled(1.0f, -1, 0.81f, 0.2f)).kept == v{1, 1, 0, 0});
  CHECK(run_truncated(x, 1, 4, t, rlpt::compat::sglang::sampled(1.0f, -1, 0.81f, 0.2f)).kept == v{1, 1, 1, 0});
  CHECK(run_truncated(x, 1, 4, t, rlpt::compat::hf::sampled(1.0f, 0, 0.81f, 0.2f)).kept == v{1, 1, 1, 0});
  CHECK(run_truncated(x, 1, 4, t, rlpt::compat::hf::sampled(1.0f, 2, 1.0f, 0.2f)).kept == v{1, 1, 0, 0});
  // the bound: the smallest float f with f - max >= log(min_p) (in double) is kept, the float below it is not
  const double bound = std::log(0.25);
  auto f = static_cast<float>(bound);
  if (static_cast<double>(f) < bound) f = std::nextafter(f, 0.0f);
  const float below = std::nextafter(f, -2.0f);
  REQUIRE(static_cast<double>(below) < bound);
  CHECK(run_truncated(std::vector<float>{0.0f, f, below}, 1, 3, std::vector<index_t>{0}, {.min_p = 0.25f}).kept ==
        v{1, 1, 0});
  // shifted by a large max (the difference is still exact in double)
  const float big = 4096.0f;
  CHECK(run_truncated(std::vector<float>{big, big + f, big + below - 0.001f}, 1, 3, std::vector<index_t>{0},
                      {.min_p = 0.25f})
            .kept[2] == 0);
  // min_p = 1 keeps the max and its ties only
  CHECK(
      run_truncated(std::vector<float>{3.0f, 1.0f, 3.0f, 2.9f}, 1, 4, std::vector<index_t>{0}, {.min_p = 1.0f}).kept ==
      v{1, 0, 1, 0});
}

TEST_CASE("top-p cut inside a tie group keeps the lowest columns of the group") {
  // four equal logits and one larger: p chosen so exactly two of the four ties are needed
  const std::vector<float> x = {1.0f, 0.0f, 1.0f, 1.0f, 1.0f, -30.0f};
  const double e = std::exp(-1.0), s = 1.0 + 4 * e; // masses relative to the max
  const float p = static_cast<float>((1.0 + 1.5 * e) / s);
  std::vector<index_t> t = {0};
  const auto pick = [&](std::vector<float> row) {
    row.insert(row.begin() + 1, 2.0f); // the max sits at column 1
    return row;
  };
  const auto row = pick(x);
  const auto run = run_truncated(row, 1, 7, t, {.top_p = p});
  // row {1, 2, 0, 1, 1, 1, -30}: kept are column 1 (max) and the first two ties by column (0, 3)
  CHECK(run.kept == std::vector<rlpt::mask_t>{1, 1, 0, 1, 0, 0, 0});
  CHECK(run.tie[0] == 3);
  CHECK(run.thr[0] == 1.0f);
  CHECK(run.logp[0] == doctest::Approx(1.0 - std::log(std::exp(2.0) + 2 * std::exp(1.0))).epsilon(1e-6));
}

TEST_CASE("a target outside the support raises by default, or scores -inf and is counted") {
  lt::rng g(12);
  const index_t cols = 300;
  auto x = lt::random_logits<float>(g, 2 * cols);
  x[5] = 20.0f;        // row 0 argmax
  x[cols + 9] = 20.0f; // row 1 argmax
  const std::vector<index_t> t = {6, 9};
  RLPT_CHECK_ERROR(run_truncated(x, 2, cols, t, {.top_k = 1}), "rlpt.logprob.dropped_target", "target 6 of row 0",
                   "rank", "neg_inf");
  const auto run = run_truncated(x, 2, cols, t, {.top_k = 1, .on_dropped = rlpt::dropped_target::neg_inf});
  CHECK(run.st.dropped == 1);
  CHECK(run.st.scored == 1);
  CHECK(std::isinf(run.logp[0]));
  CHECK(run.logp[0] < 0);
  CHECK(run.logp[1] == 0.0f); // top-1: the argmax has probability 1
  CHECK(run.ent[1] == 0.0f);
  // and no gradient flows from a dropped target
  std::vector<float> grad(2 * cols, 1.0f);
  const std::vector<float> dl = {1.0f, 1.0f};
  rlpt::logprob_entropy_backward(rlpt::view2d<const float>(x.data(), 2, cols), t, {.dlogp = dl},
                                 rlpt::view2d<float>(grad.data(), 2, cols),
                                 {.top_k = 1, .on_dropped = rlpt::dropped_target::neg_inf});
  for (index_t j = 0; j < cols; ++j) CHECK(grad[j] == 0.0f);
}

TEST_CASE("an untruncated kept mask is all ones and the saved threshold keeps everything") {
  lt::rng g(13);
  const auto x = lt::random_logits<float>(g, 3 * 100);
  const std::vector<index_t> t = {1, 2, 3};
  const auto run = run_truncated(x, 3, 100, t, {});
  for (auto k : run.kept) CHECK(k == 1);
  for (index_t r = 0; r < 3; ++r) {
    CHECK(std::isinf(run.thr[r]));
    CHECK(run.tie[r] == 99);
  }
}

// --- batch invariance -------------------------------------------------------------------------

namespace {

template <class T> void check_batch_invariance(const rlpt::logprob_options& o) {
  lt::rng g(20);
  const index_t cols = 3001, pool_rows = 7;
  auto pool = lt::random_logits<T>(g, pool_rows * cols, 4.0);
  pool[3 * cols + 17] = T(-std::numeric_limits<float>::infinity());
  std::vector<index_t> pool_t(pool_rows);
  for (index_t r = 0; r < pool_rows; ++r) {
    const auto xr = lt::to_double(pool.data() + r * cols, cols);
    index_t best = 0;
    for (index_t j = 1; j < cols; ++j) best = xr[j] > xr[best] ? j : best;
    pool_t[r] = best; // always inside any support
  }
  struct row_bits {
    float logp, ent, lse;
    std::vector<T> grad;
  };
  const auto run_batch = [&](index_t n, index_t stride, index_t offset, unsigned threads, index_t shift) {
    std::vector<T> buf(static_cast<std::size_t>(n * stride + offset + 16));
    std::vector<index_t> t(n);
    for (index_t i = 0; i < n; ++i) {
      const index_t src = (i * 5 + shift) % pool_rows;
      std::memcpy(buf.data() + offset + i * stride, pool.data() + src * cols, sizeof(T) * cols);
      t[i] = pool_t[src];
    }
    rlpt::thread_pool pool_threads(threads);
    const rlpt::host_executor ex{threads > 1 ? &pool_threads : nullptr};
    std::vector<float> logp(n), ent(n), lse(n), thr(n);
    std::vector<index_t> tie(n);
    const rlpt::view2d<const T> x(buf.data() + offset, n, cols, stride);
    rlpt::logprob_entropy(
        x, t, {.logp = logp, .entropy = ent, .saved = {.lse = lse, .threshold = thr, .tie_last = tie}}, o, ex);
    const auto dl = std::vector<float>(n, 0.75f), dh = std::vector<float>(n, -0.5f);
    std::vector<T> grad(static_cast<std::size_t>(n * cols));
    rlpt::logprob_entropy_backward(
        x, t, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse, .threshold = thr, .tie_last = tie}},
        rlpt::view2d<T>(grad.data(), n, cols), o, ex);
    std::vector<std::pair<index_t, row_bits>> out;
    for (index_t i = 0; i < n; ++i)
      out.push_back(
          {(i * 5 + shift) % pool_rows,
           {logp[i], ent[i], lse[i], std::vector<T>(grad.begin() + i * cols, grad.begin() + (i + 1) * cols)}});
    return out;
  };
  std::vector<row_bits> canon;
  for (index_t r = 0; r < pool_rows; ++r) canon.push_back(run_batch(1, cols, 0, 1, r)[0].second);
  const auto same = [](const row_bits& a, const row_bits& b) {
    return std::memcmp(&a.logp, &b.logp, 4) == 0 && std::memcmp(&a.ent, &b.ent, 4) == 0 &&
           std::memcmp(&a.lse, &b.lse, 4) == 0 &&
           std::memcmp(a.grad.data(), b.grad.data(), a.grad.size() * sizeof(T)) == 0;
  };
  for (const index_t n : {2, 3, 8, 33})
    for (const index_t stride : {cols, cols + 1, cols + 7})
      for (const index_t offset : {0, 1, 3})
        for (const unsigned threads : {1u, 2u, 3u}) {
          const auto got = run_batch(n, stride, offset, threads, n % pool_rows);
          for (const auto& [src, bits] : got) {
            INFO("N " << n << " stride " << stride << " offset " << offset << " threads " << threads << " row " << src);
            CHECK(same(bits, canon[static_cast<std::size_t>(src)]));
          }
        }
}

} // namespace

TEST_CASE_TEMPLATE("results are bitwise independent of N, row position, stride, alignment and threads", T, float,
                   rlpt::bf16, rlpt::f16) {
  check_batch_invariance<T>({.temperature = 0.9f});
  check_batch_invariance<T>({.temperature = 0.9f, .top_k = 100, .top_p = 0.9f});
  check_batch_invariance<T>({.temperature = 0.9f, .top_p = 0.9f, .min_p = 0.02f});
  check_batch_invariance<T>({.top_k = 100, .top_p = 0.8f, .min_p = 0.05f, .min_p_order = rlpt::min_p_order::last});
}

// --- errors -------------------------------------------------------------------------------------

TEST_CASE("bad input raises clear errors naming the values") {
  lt::rng g(30);
  const index_t cols = 50;
  auto x = lt::random_logits<float>(g, 4 * cols);
  std::vector<index_t> t = {0, 1, 2, 3};
  std::vector<float> logp(4), ent(4), lse0(4);
  const rlpt::view2d<const float> xv(x.data(), 4, cols);
  for (const float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()})
    RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent, {.temperature = bad}), "rlpt.logprob.temperature",
                     "temperature must be finite and > 0");
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent, {.temperature = -0.5f}), "rlpt.logprob.temperature",
                   "got -0.5");
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent, {.top_k = -2}), "rlpt.logprob.top_k", "got -2");
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent, {.top_p = 0.0f}), "rlpt.logprob.top_p", "(0, 1]");
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent, {.top_p = 1.5f}), "rlpt.logprob.top_p", "got 1.5");
  for (const float bad : {-0.1f, 1.5f, std::numeric_limits<float>::quiet_NaN()})
    RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent, {.min_p = bad}), "rlpt.logprob.min_p", "[0, 1]");
  RLPT_CHECK_ERROR(
      rlpt::logprob_entropy(xv, t, logp, ent, {.min_p = 0.1f, .min_p_order = static_cast<rlpt::min_p_order>(7)}),
      "rlpt.logprob.min_p", "min_p_order is 7");
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, {.logp = logp, .saved = {.lse = lse0}}, {.min_p = 0.1f}),
                   "rlpt.logprob.missing_saved", "saved.threshold");

  t[2] = cols;
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent), "rlpt.logprob.target_out_of_range", "target 50 of row 2",
                   "[0, 50)");
  t[2] = -5;
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent), "rlpt.logprob.target_out_of_range", "target -5",
                   "ignore_index (-100)");
  t[2] = 2;

  const std::vector<index_t> short_t = {0, 1, 2};
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, short_t, logp, ent), "rlpt.view.size_mismatch", "targets has 3 elements",
                   "expected 4");
  std::vector<float> short_out(3);
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, short_out, ent), "rlpt.view.size_mismatch", "logp has 3 elements");
  std::vector<rlpt::mask_t> kept(4 * 49);
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, {.logp = logp, .kept = rlpt::view2d<rlpt::mask_t>(kept.data(), 4, 49)}),
                   "rlpt.logprob.shape_mismatch", "kept mask is [4, 49]", "[4, 50]");
  std::vector<float> lse(4);
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, {.logp = logp, .saved = {.lse = lse}}, {.top_p = 0.9f}),
                   "rlpt.logprob.missing_saved", "saved.threshold");

  auto nan_x = x;
  nan_x[2 * cols + 7] = std::numeric_limits<float>::quiet_NaN();
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(rlpt::view2d<const float>(nan_x.data(), 4, cols), t, logp, ent),
                   "rlpt.logprob.nonfinite", "row 2", "NaN");
  auto inf_x = x;
  inf_x[1 * cols + 3] = std::numeric_limits<float>::infinity();
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(rlpt::view2d<const float>(inf_x.data(), 4, cols), t, logp, ent),
                   "rlpt.logprob.nonfinite", "row 1");
  auto ninf_x = x;
  for (index_t j = 0; j < cols; ++j) ninf_x[3 * cols + j] = -std::numeric_limits<float>::infinity();
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(rlpt::view2d<const float>(ninf_x.data(), 4, cols), t, logp, ent),
                   "rlpt.logprob.nonfinite", "row 3", "every logit is -inf");

  std::vector<float> grad(4 * cols);
  RLPT_CHECK_ERROR(rlpt::logprob_entropy_backward(xv, t, {.dlogp = logp}, rlpt::view2d<float>(grad.data(), 4, 49)),
                   "rlpt.logprob.shape_mismatch", "dlogits are [4, 49]");
  auto inplace = x;
  const rlpt::view2d<float> shifted(inplace.data() + 1, 4, cols);
  RLPT_CHECK_ERROR(
      rlpt::logprob_entropy_backward(rlpt::view2d<const float>(inplace.data(), 4, cols), t, {.dlogp = logp}, shifted),
      "rlpt.logprob.alias", "partially overlaps");
  const rlpt::view2d<const float> empty_vocab(x.data(), 4, 0);
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(empty_vocab, t, logp, ent), "rlpt.logprob.shape_mismatch", "0 columns");
}
