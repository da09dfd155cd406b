// SPDX-License-Identifier: Apache-2.0
// The device kernels' per-row arithmetic, run on the host: the base-2 log-sum-exp fold, merge and
// finish (lse2_*), the temperature division, the backward's per-row decision, the vocab-parallel
// finish and the fused kernel's launch shape are RLPT_HD code shared with the kernels, so these
// tests pin what the device computes (with exp2f in place of the MUFU ex2). Each case is a bug a
// review of the never-run device code found (issue 16) or a conformance point (issue 19).
#include <rlpt/logprob.hpp>
#include <rlpt/logprob/detail/device_rows.hpp>
#ifdef RLPT_TEST_LM_HEAD // component lm_head (Eigen) found: tests/logprob/CMakeLists.txt
#include <rlpt/logprob/lm_head.hpp>
#endif

#include "device_model.hpp"
#include "reference.hpp"
#include "support/errors.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

using rlpt::index_t;
namespace lt = rlpt::test;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();
constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

// Tempered logits z whose base-2 shift m = RN(z·log2e) rounds up: the maximum's own weight
// 2^fma(z, log2e, −m) is then just below 1.
std::vector<float> maxima_rounding_up(int count) {
  std::vector<float> out;
  for (float z = 3.0f; static_cast<int>(out.size()) < count; z = std::nextafter(z * 1.37f, inf)) {
    const float m = z * rlpt::detail::log2e_f;
    if (std::fma(z, rlpt::detail::log2e_f, -m) < 0.0f) out.push_back(z);
  }
  return out;
}

} // namespace

TEST_CASE("peaked rows, top_k = 1 and tiny top_p keep a usable softmax in the device fold") {
  // issue 16 item 1: the device declared a row unusable unless Σ 2^d >= 1; a one-token support
  // sums to 2^(rounding error of m), below 1 about half the time -> NaN logp and entropy.
  const auto peaks = maxima_rounding_up(8);
  REQUIRE(peaks.size() == 8);
  for (const float zmax : peaks) {
    INFO("row max " << zmax);
    // a peaked row: the runner-up 40 nats below (weight 2^-57: lost next to 1)
    float z[8] = {zmax - 40.0f, zmax, -inf, zmax - 45.0f, -inf, -inf, -inf, -inf};
    rlpt::lse_state2 st = rlpt::lse2_empty();
    rlpt::lse2_fold(st, z);
    CHECK(st.s < 1.0f); // what made the old check fail
    CHECK(rlpt::lse2_ok(st));
    const rlpt::row_result res = rlpt::lse2_finish(st);
    CHECK(std::isfinite(res.lse));
    CHECK(res.entropy == doctest::Approx(0.0).epsilon(1e-6));
    CHECK(rlpt::lse2_logp(zmax, st) == doctest::Approx(0.0).epsilon(1e-6));
    // the truncated forward's kept-mass fold with top_k = 1: only the maximum is added
    rlpt::lse_state2 kept{st.m, 0.0f, 0.0f};
    rlpt::lse2_add(kept, std::fma(zmax, rlpt::detail::log2e_f, -st.m));
    CHECK(kept.s < 1.0f);
    CHECK(rlpt::lse2_ok(kept));
    CHECK(std::isfinite(rlpt::lse2_finish(kept).lse));
    // vocab-parallel: the device rank's state in natural units, finished by the shared lse_ok
    const rlpt::lse_state nat = rlpt::lse2_natural(st);
    CHECK(rlpt::lse_ok(nat));
    CHECK(std::isfinite(rlpt::lse_finish(nat).lse));
  }
  // the lm-head tile fold and the plain forward fold whole rows through the block model
  for (const float zmax : peaks) {
    std::vector<float> row(1000, zmax - 50.0f);
    row[617] = zmax;
    const rlpt::lse_state2 st = lt::device_row_model(row.data(), 1000, 128, rlpt::tempering::of(1.0f));
    INFO("row max " << zmax);
    CHECK(rlpt::lse2_ok(st));
    CHECK(rlpt::lse2_logp(zmax, st) == doctest::Approx(0.0).epsilon(1e-6));
  }
}

TEST_CASE("a device rank's state in natural units scores its row maximum at log p = 0 (vocab-parallel)") {
  // The wire's m is m2·ln2 rounded; before the rounding moved into s, a one-token row scored
  // z − m − ln s = the rounding itself: up to ~3e-5 at |z| ~ 700 (seen on an H200).
  for (float zmax = 3.0f; zmax < 5000.0f; zmax = std::nextafter(zmax * 1.37f, inf)) {
    for (const float peak : {zmax, -zmax}) {
      INFO("row max " << peak);
      float z[8] = {peak - 40.0f, peak, -inf, peak - 45.0f, -inf, -inf, peak - 1.5f, -inf};
      rlpt::lse_state2 st = rlpt::lse2_empty();
      rlpt::lse2_fold(st, z);
      const rlpt::lse_state nat = rlpt::lse2_natural(st);
      REQUIRE(rlpt::lse_ok(nat));
      double sum = 0.0; // fp64 reference
      for (const float x : z) sum += std::exp(static_cast<double>(x) - peak);
      const double lse = peak + std::log(sum);
      CHECK(static_cast<double>(rlpt::lse_logp(peak, nat)) == doctest::Approx(peak - lse).epsilon(1e-6));
      CHECK(static_cast<double>(rlpt::lse_logp(peak - 1.5f, nat)) ==
            doctest::Approx(static_cast<double>(peak - 1.5f) - lse).epsilon(1e-6));
      CHECK(static_cast<double>(rlpt::lse_finish(nat).lse) == doctest::Approx(lse).epsilon(1e-7));
      // through the rebase onto a larger all-reduced max (a rank without the peak)
      const rlpt::lse_state up = rlpt::lse_rebase(nat, nat.m + 3.0f);
      CHECK(static_cast<double>(rlpt::lse_logp(peak, up)) == doctest::Approx(peak - lse).epsilon(1e-6));
    }
  }
}

TEST_CASE("a NaN logit poisons its row in the device fold even while the running max is -inf") {
  // issue 16 item 2: the fold returned early while its max was still -inf, dropping a NaN whose
  // neighbours were -inf; a later finite vector then made the row look usable.
  float first[8] = {-inf, nan_f, -inf, -inf, -inf, -inf, -inf, -inf};
  float later[8] = {0.5f, 1.0f, -2.0f, 3.0f, 0.0f, 0.25f, -1.0f, 2.0f};
  rlpt::lse_state2 st = rlpt::lse2_empty();
  rlpt::lse2_fold(st, first);
  CHECK(st.s != st.s);
  rlpt::lse2_fold(st, later);
  CHECK_FALSE(rlpt::lse2_ok(st));
  CHECK(std::isnan(rlpt::lse2_finish(st).lse));
  // all-NaN vector, and a NaN lane merged with a finite one
  float all_nan[4] = {nan_f, nan_f, nan_f, nan_f};
  rlpt::lse_state2 a = rlpt::lse2_empty();
  rlpt::lse2_fold(a, all_nan);
  rlpt::lse_state2 b = rlpt::lse2_empty();
  float fine[4] = {1.0f, 2.0f, 3.0f, 4.0f};
  rlpt::lse2_fold(b, fine);
  CHECK_FALSE(rlpt::lse2_ok(rlpt::lse2_merge(a, b)));
  CHECK_FALSE(rlpt::lse2_ok(rlpt::lse2_merge(b, a)));
  // a whole row through the block model: one NaN among -inf in a thread's first vector
  std::vector<float> row(4099, 1.0f);
  for (index_t j = 0; j < 8; ++j) row[static_cast<std::size_t>(j)] = -inf;
  row[3] = nan_f;
  CHECK_FALSE(rlpt::lse2_ok(lt::device_row_model(row.data(), 4099, 256, rlpt::tempering::of(0.7f))));
}

TEST_CASE("the device backward decides each row from the forward's logp, never from the logits") {
  // issue 16 item 3: blocks of an in-place backward re-read x[target] to decide whether the target
  // was kept; another block of the row may already have overwritten it with its gradient.
  const index_t cols = 64;
  lt::rng g(70);
  auto x = lt::random_logits<float>(g, cols, 2.0);
  for (auto& v : x) v -= 10.0f; // every logit negative: a gradient written over x[target] (0) would look kept
  const rlpt::logprob_options o{.temperature = 0.8f, .top_k = 5, .on_dropped = rlpt::dropped_target::neg_inf};
  // target: a column outside the top-5 (dropped, logp -inf)
  index_t target = 0;
  std::vector<float> sorted = x;
  std::sort(sorted.begin(), sorted.end());
  for (index_t j = 0; j < cols; ++j)
    if (x[static_cast<std::size_t>(j)] < sorted[static_cast<std::size_t>(cols - 10)]) target = j;
  const std::vector<index_t> t = {target};
  std::vector<float> logp(1), ent(1), lse(1), thr(1);
  std::vector<index_t> tie(1);
  rlpt::logprob_entropy(rlpt::view2d<const float>(x.data(), 1, cols), t,
                        {.logp = logp, .entropy = ent, .saved = {.lse = lse, .threshold = thr, .tie_last = tie}}, o);
  REQUIRE(logp[0] == -inf);
  const std::vector<float> dl = {0.75f}, dh = {0.0f};
  const rlpt::detail::backward_args a{
      1,          cols,      cols,        cols,       rlpt::tempering::of(o.temperature),
      dl.data(),  dh.data(), logp.data(), ent.data(), lse.data(),
      thr.data(), tie.data()};
  const rlpt::detail::row_job jb{true, true, target, 0};
  // out of place: each chunk of 16 columns reads the untouched logits
  std::vector<float> want(static_cast<std::size_t>(cols));
  for (index_t q = 0; q < cols; q += 16) {
    const auto b = rlpt::detail::backward_row_of(a, 0, jb);
    for (index_t j = q; j < q + 16; ++j)
      want[static_cast<std::size_t>(j)] = rlpt::detail::backward_element(x[static_cast<std::size_t>(j)], j, b, a.tp);
  }
  // in place, the target's chunk first (the order the device does not promise)
  auto inplace = x;
  std::vector<index_t> order = {target / 16 * 16};
  for (index_t q = 0; q < cols; q += 16)
    if (q != order[0]) order.push_back(q);
  for (const index_t q : order) {
    const auto b = rlpt::detail::backward_row_of(a, 0, jb);
    for (index_t j = q; j < q + 16; ++j)
      inplace[static_cast<std::size_t>(j)] =
          rlpt::detail::backward_element(inplace[static_cast<std::size_t>(j)], j, b, a.tp);
  }
  CHECK(std::memcmp(inplace.data(), want.data(), sizeof(float) * static_cast<std::size_t>(cols)) == 0);
  // a dropped target has no gradient at all (the host says the same)
  for (const float gj : want) CHECK(gj == 0.0f);
  std::vector<float> host(static_cast<std::size_t>(cols));
  rlpt::logprob_entropy_backward(rlpt::view2d<const float>(x.data(), 1, cols), t,
                                 {.dlogp = dl, .logp = logp, .saved = {.lse = lse, .threshold = thr, .tie_last = tie}},
                                 rlpt::view2d<float>(host.data(), 1, cols), o);
  for (const float gj : host) CHECK(gj == 0.0f);
  // the rule itself: -inf -> no gradient, NaN -> NaN row, finite -> dlogp
  CHECK(rlpt::detail::target_dlogp(0.75f, -inf) == 0.0f);
  CHECK(std::isnan(rlpt::detail::target_dlogp(0.75f, nan_f)));
  CHECK(rlpt::detail::target_dlogp(0.75f, -3.0f) == 0.75f);
  CHECK(rlpt::detail::target_dlogp(0.0f, nan_f) == 0.0f);
}

TEST_CASE("a target no vocab-parallel shard holds is NaN and counted, not -lse") {
  // issue 16 item 4: every device rank wrote 0 into the target slot, so the row scored -lse.
  const index_t vocab = 30, n_ranks = 3;
  lt::rng g(71);
  const auto x = lt::random_logits<float>(g, vocab);
  for (const index_t target : {index_t{-5}, index_t{30}, index_t{1000}}) {
    rlpt::lse_state sum{};
    float slot = 0.0f;
    float gmax = -inf;
    std::vector<rlpt::lse_state> local;
    for (index_t q = 0; q < n_ranks; ++q) {
      const rlpt::lse_state2 st =
          lt::device_row_model(x.data() + q * 10, 10, 128, rlpt::tempering::of(1.0f)); // the local kernel's fold
      local.push_back(rlpt::lse2_natural(st));
      gmax = std::max(gmax, local.back().m);
      const bool bad = rlpt::detail::vocab_target_invalid(target, vocab, -100);
      const index_t y = target - q * 10;
      slot += bad ? nan_f : y >= 0 && y < 10 ? x[static_cast<std::size_t>(target)] : 0.0f;
    }
    sum.m = gmax;
    for (const auto& l : local) {
      const rlpt::lse_state r = rlpt::lse_rebase(l, gmax);
      sum.s += r.s;
      sum.a += r.a;
    }
    const rlpt::detail::vocab_row row = rlpt::detail::vocab_parallel_row(sum, slot, true);
    INFO("target " << target);
    CHECK(std::isnan(row.logp));
    CHECK(row.counter == 1);
    CHECK_FALSE(row.scored);
    CHECK(std::isfinite(row.res.entropy)); // the row itself is fine
  }
  // an ignored target is neither invalid nor scored
  CHECK_FALSE(rlpt::detail::vocab_target_invalid(-100, vocab, -100));
  const rlpt::detail::vocab_row ok = rlpt::detail::vocab_parallel_row({1.0f, 1.5f, -0.2f}, 0.5f, true);
  CHECK(ok.scored);
  CHECK(ok.counter == -1);
}

TEST_CASE("the fused forward+backward folds a row in the plain forward's tree") {
  // issue 16 item 5: the fused kernel ran 1024 threads per block where the plain forward runs
  // 128/256/512 by V, so their summation trees (and bits) differed: the bitwise test could not pass.
  for (const index_t v : {1000, 4099, 20001, 32769, 151936, 262144}) {
    const auto f = rlpt::detail::fused_launch_for<rlpt::bf16>(4096, v, 132, index_t{60} << 20);
    CHECK(f.block == rlpt::detail::device_row_block<rlpt::bf16>(v));
    CHECK(f.grid >= 132);
    CHECK(f.grid * f.block <= 132 * 2048);
    const auto g32 = rlpt::detail::fused_launch_for<float>(4096, v, 132, index_t{60} << 20);
    CHECK(g32.block == rlpt::detail::device_row_block<float>(v));
  }
  CHECK(rlpt::detail::fused_launch_for<float>(7, 1000, 132, index_t{60} << 20).grid == 7);
  // why it matters: 1024- and 256-thread trees give other bits for most rows at V = 20001
  lt::rng g(72);
  const index_t v = 20001;
  const auto x = lt::random_logits<rlpt::bf16>(g, static_cast<std::size_t>(8 * v), 3.0);
  int differ = 0;
  for (index_t r = 0; r < 8; ++r) {
    const auto* row = x.data() + r * v;
    const auto a = lt::device_row_model(row, v, 1024, rlpt::tempering::of(1.1f));
    const auto b =
        lt::device_row_model(row, v, rlpt::detail::device_row_block<rlpt::bf16>(v), rlpt::tempering::of(1.1f));
    const auto c =
        lt::device_row_model(row, v, rlpt::detail::device_row_block<rlpt::bf16>(v), rlpt::tempering::of(1.1f));
    differ += std::memcmp(&a, &b, sizeof a) != 0 ? 1 : 0;
    CHECK(std::memcmp(&b, &c, sizeof b) == 0);
  }
  CHECK(differ > 0);
}

TEST_CASE("the device temperature division is x / T rounded once") {
  // issue 19: multiplying by float(1/T) differs from x / T in the last bit for ~25% of logits.
  // The device divides with RN(1/T) and one FMA correction (no MUFU reciprocal per element);
  // here that formula is checked against IEEE division.
  const std::vector<float> temps = {0.3f, 0.6f, 0.7f, 0.77f, 0.9f, 0.999f, 1.0f, 1.1f, 1.3f, 2.0f, 7.3f, 1e-3f, 1e3f};
  lt::rng g(73);
  std::vector<float> xs;
  for (std::uint32_t h = 0; h < 65536; ++h) {
    xs.push_back(std::bit_cast<float>(h << 16));                                           // every bf16
    xs.push_back(static_cast<float>(rlpt::f16::from_bits(static_cast<std::uint16_t>(h)))); // every f16
  }
  for (int i = 0; i < 200000; ++i)
    xs.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(g.integer(0, 0xffffffffLL))));
  for (const float s : {0.0f, -0.0f, inf, -inf, nan_f, 1e-45f, 1e-38f, 3.0e38f, 3.4028235e38f, 1e-20f, 8.7e-19f})
    xs.push_back(s);
  int mult_differs = 0;
  for (const float t : temps) {
    const float r = 1.0f / t;
    long bad = 0;
    for (const float x : xs) {
      const float want = x / t;
      if (!(std::fabs(want) >= 0x1p-126f) && want == want && want != 0.0f) continue; // subnormal results: see div_rn
      const float got = rlpt::detail::div_rn(x, t, r);
      if (std::bit_cast<std::uint32_t>(got) != std::bit_cast<std::uint32_t>(want) && !(got != got && want != want))
        ++bad;
      mult_differs += std::bit_cast<std::uint32_t>(x * r) != std::bit_cast<std::uint32_t>(want) ? 1 : 0;
    }
    INFO("T " << t);
    CHECK(bad == 0);
    CHECK(rlpt::detail::temper(0.7f, rlpt::tempering::of(t)) == 0.7f / t);
  }
  CHECK(mult_differs > 0);
}

TEST_CASE("logits are divided by the temperature: the kept threshold is x / T to the bit") {
  // top_k = 1 keeps the maximum: saved.threshold is its tempered logit, bit for bit.
  const float t = 0.7f;
  std::vector<float> x;
  for (float v = 1.0f; x.size() < 64; v = std::nextafter(v, inf))
    if (v / t != v * (1.0f / t)) x.push_back(v); // logits where the two roundings differ
  const index_t n = static_cast<index_t>(x.size()), cols = 2;
  std::vector<float> rows;
  for (const float v : x) {
    rows.push_back(v);
    rows.push_back(-1.0f);
  }
  const std::vector<index_t> tg(static_cast<std::size_t>(n), 0);
  std::vector<float> logp(static_cast<std::size_t>(n)), lse(static_cast<std::size_t>(n)),
      thr(static_cast<std::size_t>(n));
  std::vector<index_t> tie(static_cast<std::size_t>(n));
  rlpt::logprob_entropy(rlpt::view2d<const float>(rows.data(), n, cols), tg,
                        {.logp = logp, .saved = {.lse = lse, .threshold = thr, .tie_last = tie}},
                        {.temperature = t, .top_k = 1});
  for (index_t r = 0; r < n; ++r) {
    INFO("logit " << x[static_cast<std::size_t>(r)]);
    CHECK(thr[static_cast<std::size_t>(r)] == x[static_cast<std::size_t>(r)] / t);
    CHECK(lse[static_cast<std::size_t>(r)] == x[static_cast<std::size_t>(r)] / t); // one token: lse = z
  }
}

TEST_CASE("log-probabilities keep their relative precision at |logit| ~ 1e4") {
  // issue 19: z_t - lse with lse rounded to float loses ~1e-3 relative at |z| ~ 1e4;
  // (z_t - m) - log s keeps it (host), and so does the device's base-2 form.
  lt::rng g(74);
  const index_t n = 16, cols = 300;
  for (const float base : {1.0e4f, -1.0e4f, 3.0e4f}) {
    std::vector<float> x(static_cast<std::size_t>(n * cols));
    for (auto& v : x) v = base + static_cast<float>(g.normal()) * 2.0f;
    std::vector<index_t> t(static_cast<std::size_t>(n));
    for (index_t r = 0; r < n; ++r) {
      index_t best = 0;
      for (index_t j = 1; j < cols; ++j)
        if (x[static_cast<std::size_t>(r * cols + j)] > x[static_cast<std::size_t>(r * cols + best)]) best = j;
      t[static_cast<std::size_t>(r)] = best; // the likeliest token: logp small, precision matters
    }
    for (const float temp : {1.0f, 0.7f}) {
      std::vector<float> logp(static_cast<std::size_t>(n));
      rlpt::logprob_entropy(rlpt::view2d<const float>(x.data(), n, cols), t, {.logp = logp}, {.temperature = temp});
      std::vector<double> want;
      std::vector<float> device;
      for (index_t r = 0; r < n; ++r) {
        const float* row = x.data() + r * cols;
        std::vector<double> z(static_cast<std::size_t>(cols)); // the fp64 reference on the same tempered floats
        for (index_t j = 0; j < cols; ++j) z[static_cast<std::size_t>(j)] = static_cast<double>(row[j] / temp);
        want.push_back(lt::reference_row(z, 1.0, t[static_cast<std::size_t>(r)]).logp);
        const auto st = lt::device_row_model(row, cols, 128, rlpt::tempering::of(temp));
        device.push_back(
            rlpt::lse2_logp(rlpt::detail::temper(row[t[static_cast<std::size_t>(r)]], rlpt::tempering::of(temp)), st));
      }
      INFO("base " << base << " temperature " << temp);
      RLPT_CHECK_CLOSE(logp, want, 2e-5, 1e-6);
      RLPT_CHECK_CLOSE(device, want, 2e-5, 1e-6);
    }
  }
}

TEST_CASE("non-finite logits are reported with their row, column and value") {
  // issue 18: the message named the row only
  std::vector<float> x(4 * 50, 0.5f);
  x[2 * 50 + 37] = nan_f;
  x[1 * 50 + 11] = inf;
  const std::vector<index_t> t = {0, 1, 2, 3};
  std::vector<float> logp(4), ent(4);
  const rlpt::view2d<const float> xv(x.data(), 4, 50);
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent), "rlpt.logprob.nonfinite", "row 1", "column 11", "inf");
  x[1 * 50 + 11] = 0.5f;
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent, {.temperature = 0.5f}), "rlpt.logprob.nonfinite", "row 2",
                   "column 37", "nan", "temperature 0.5");
  // a logit that only overflows after the temperature: named with both values
  x[2 * 50 + 37] = 3.0e38f;
  RLPT_CHECK_ERROR(rlpt::logprob_entropy(xv, t, logp, ent, {.temperature = 0.5f}), "rlpt.logprob.nonfinite", "row 2",
                   "column 37", "3e+38", "inf after temperature");
  std::vector<float> grad(4 * 50);
  const std::vector<float> ones(4, 1.0f);
  RLPT_CHECK_ERROR(rlpt::logprob_entropy_backward(xv, t, {.dlogp = ones}, rlpt::view2d<float>(grad.data(), 4, 50),
                                                  {.temperature = 0.5f}),
                   "rlpt.logprob.nonfinite", "row 2", "column 37");
}

TEST_CASE("a logits view with a negative extent is reported as such, before any size comparison") {
  // issue 18: "targets has 0 elements, expected -1". Views reject a negative extent where they are
  // built (rlpt.view.bad_shape); the logprob entry points check the shape first as well
  // (rlpt.logprob.shape_mismatch), so no size is ever compared against -1.
  std::vector<float> x(100, 0.0f);
  const std::vector<index_t> t;
  std::vector<float> logp;
  const auto expect_negative = [](auto&& call, const char* shape) {
    std::string id, message;
    try {
      call();
    } catch (const rlpt::error& e) {
      id = e.id();
      message = e.message();
    }
    INFO("id " << id << ": " << message);
    CHECK((id == "rlpt.view.bad_shape" || id == "rlpt.logprob.shape_mismatch"));
    CHECK(message.find(shape) != std::string::npos);
    CHECK(message.find("negative") != std::string::npos);
    CHECK(message.find("elements, expected") == std::string::npos);
  };
  expect_negative([&] { rlpt::logprob_entropy(rlpt::view2d<const float>(x.data(), -1, 10), t, {.logp = logp}); },
                  "[-1, 10]");
  expect_negative(
      [&] {
        rlpt::logprob_entropy_backward(rlpt::view2d<const float>(x.data(), -1, 10), t, {},
                                       rlpt::view2d<float>(x.data(), -1, 10));
      },
      "[-1, 10]");
  const rlpt::token_layout layout = rlpt::token_layout::padded(1, 10);
  expect_negative(
      [&] {
        rlpt::sequence_logprob_entropy(rlpt::view2d<const float>(x.data(), 10, -3), t, layout, {}, {.logp = logp});
      },
      "[10, -3]");
  std::vector<float> comm(40), lm(10);
  expect_negative(
      [&] {
        rlpt::vocab_parallel_local(rlpt::view2d<const float>(x.data(), -2, 10), t, {.begin = 0, .vocab = 10}, comm, lm);
      },
      "[-2, 10]");
#ifdef RLPT_TEST_LM_HEAD
  expect_negative(
      [&] {
        rlpt::fused_lm_head_logprob(rlpt::view2d<const float>(x.data(), -1, 10),
                                    rlpt::view2d<const float>(x.data(), 10, 10), t, {.logp = logp});
      },
      "[-1, 10]");
#endif
  // the entry points' own check, on a shape a view can hold: a row stride below the columns
  RLPT_CHECK_ERROR(rlpt::detail::check_logits_shape(3, 10, 4, true), "rlpt.logprob.shape_mismatch", "row stride 4",
                   "overlap");
  RLPT_CHECK_ERROR(rlpt::detail::check_logits_shape(-1, 10, 10, true, "local logits"), "rlpt.logprob.shape_mismatch",
                   "local logits view is [-1, 10]", "negative");
}
