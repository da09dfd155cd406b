// SPDX-License-Identifier: Apache-2.0
// The training-inference mismatch metrics (logprob/mismatch.hpp): verl's own
// compute_offpolicy_metrics and calculate_debug_metrics on the golden inputs
// (tools/golden/gen_logprob.py), an independent fp64 reference for the statistics verl does not
// log, and the properties: identical log-probs, padded = packed, empty rows, masked garbage,
// non-finite inputs, and the named errors.
#include <rlpt/logprob/mismatch.hpp>

#include "support/errors.hpp"
#include "support/golden.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

using rlpt::index_t;
using rlpt::mask_t;
namespace lt = rlpt::test;

namespace {

// verl's names in the golden file's order (tools/golden/gen_logprob.py, OFFPOLICY_KEYS, DEBUG_KEYS).
std::vector<double> offpolicy_of(const rlpt::mismatch_metrics& m) {
  return {m.k1,
          m.k3,
          m.trainer_ppl,
          m.trainer_log_ppl,
          m.rollout_ppl,
          m.rollout_log_ppl,
          m.log_ppl_diff,
          m.log_ppl_abs_diff,
          m.log_ppl_diff_max,
          m.log_ppl_diff_min,
          m.ppl_ratio,
          m.chi2_token,
          m.chi2_seq};
}
std::vector<double> debug_of(const rlpt::mismatch_metrics& m) {
  return {m.prob_abs_diff_max, m.prob_abs_diff_mean, m.prob_abs_diff_std, m.pearson_prob};
}

std::vector<double> all_of(const rlpt::mismatch_metrics& m) {
  std::vector<double> v = offpolicy_of(m);
  for (double x : debug_of(m)) v.push_back(x);
  for (double x :
       {m.tokens, m.seqs, m.nonfinite_tokens, m.abs_diff_mean, m.abs_diff_max, m.pearson_logp, m.out_of_band})
    v.push_back(x);
  return v;
}

//! Every metric of a and b, bit for bit.
void check_same(const rlpt::mismatch_metrics& a, const rlpt::mismatch_metrics& b) {
  const std::vector<double> x = all_of(a), y = all_of(b);
  for (std::size_t k = 0; k < x.size(); ++k) {
    INFO("metric " << k);
    CHECK(x[k] == y[k]);
  }
}

struct batch {
  index_t B = 0, T = 0;
  std::vector<float> trainer, rollout;
  std::vector<mask_t> mask;
  [[nodiscard]] rlpt::mismatch_inputs inputs() const {
    return {.layout = rlpt::token_layout::padded(B, T), .mask = mask, .trainer_logp = trainer, .rollout_logp = rollout};
  }
};

batch random_batch(std::uint64_t seed, index_t B, index_t T) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  std::uniform_int_distribution<index_t> len(1, T);
  batch x{B, T, std::vector<float>(static_cast<std::size_t>(B * T)),
          std::vector<float>(static_cast<std::size_t>(B * T)), std::vector<mask_t>(static_cast<std::size_t>(B * T))};
  for (index_t b = 0; b < B; ++b) {
    const index_t l = len(g);
    for (index_t t = 0; t < T; ++t) {
      const auto i = static_cast<std::size_t>(b * T + t);
      const double r = -std::fabs(1.5 * n(g)) - 1e-3;
      x.rollout[i] = static_cast<float>(r);
      x.trainer[i] = static_cast<float>(std::min(r + 0.1 * n(g), -1e-4));
      x.mask[i] = t < l ? 1 : 0;
    }
  }
  return x;
}

} // namespace

TEST_CASE("logprob_mismatch: verl's compute_offpolicy_metrics and calculate_debug_metrics on the golden inputs") {
  const lt::golden_file f(lt::golden_path("logprob", "mismatch.bin"));
  const auto B = static_cast<index_t>(f["trainer_logp"].shape[0]), T = static_cast<index_t>(f["trainer_logp"].shape[1]);
  const auto trainer = f.get<float>("trainer_logp"), rollout = f.get<float>("rollout_logp");
  const auto mask = f.get<mask_t>("mask");
  // Masked slots hold NaN (trainer) and -inf (rollout) in the file: they must not reach a metric.
  const rlpt::mismatch_metrics m = rlpt::logprob_mismatch<float>(
      {.layout = rlpt::token_layout::padded(B, T), .mask = mask, .trainer_logp = trainer, .rollout_logp = rollout});
  double valid = 0;
  for (auto v : mask) valid += v;
  CHECK(m.tokens == valid);
  CHECK(m.seqs == static_cast<double>(B)); // every golden row has a valid token (verl counts empty rows too)
  CHECK(m.nonfinite_tokens == 0.0);
  const std::vector<double> off = offpolicy_of(m), dbg = debug_of(m);
  const auto off64 = f.get<double>("verl_offpolicy_f64"), dbg64 = f.get<double>("verl_debug_f64");
  const auto off32 = f.get<double>("verl_offpolicy_f32"), dbg32 = f.get<double>("verl_debug_f32");
  // verl on float64 tensors: the same sums up to their order and verl's +1e-8 in each denominator
  RLPT_CHECK_CLOSE(off, off64, 1e-9, 1e-12);
  RLPT_CHECK_CLOSE(dbg, dbg64, 1e-9, 1e-12);
  // verl as it runs, on float32 tensors: within float32 rounding
  RLPT_CHECK_CLOSE(off, off32, 1e-5, 1e-6);
  RLPT_CHECK_CLOSE(dbg, dbg32, 1e-5, 1e-6);
  // the golden batch has tokens far outside the band (row 3: log rho = 1.5)
  CHECK(m.out_of_band > 0.0);
  CHECK(m.abs_diff_max >= 1.5 - 1e-6);
}

TEST_CASE("logprob_mismatch: the statistics verl does not log, against a direct fp64 evaluation") {
  const batch x = random_batch(11, 9, 33);
  const rlpt::mismatch_options opt{.eps_low = 0.1, .eps_high = 0.15};
  const rlpt::mismatch_metrics m = rlpt::logprob_mismatch(x.inputs(), opt);
  std::vector<double> t, r;
  for (std::size_t i = 0; i < x.mask.size(); ++i)
    if (x.mask[i] != 0) t.push_back(x.trainer[i]), r.push_back(x.rollout[i]);
  const auto n = static_cast<double>(t.size());
  double mt = 0, mr = 0, adiff = 0, amax = 0, out = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    mt += t[i] / n, mr += r[i] / n;
    adiff += std::fabs(t[i] - r[i]) / n;
    amax = std::max(amax, std::fabs(t[i] - r[i]));
    const double rho = std::exp(t[i] - r[i]);
    out += (rho < 0.9 || rho > 1.15) ? 1.0 / n : 0.0;
  }
  double stt = 0, srr = 0, str = 0;
  for (std::size_t i = 0; i < t.size(); ++i)
    stt += (t[i] - mt) * (t[i] - mt), srr += (r[i] - mr) * (r[i] - mr), str += (t[i] - mt) * (r[i] - mr);
  CHECK(m.tokens == n);
  CHECK(m.abs_diff_mean == doctest::Approx(adiff).epsilon(1e-12));
  CHECK(m.abs_diff_max == doctest::Approx(amax).epsilon(1e-15));
  CHECK(m.pearson_logp == doctest::Approx(str / std::sqrt(stt * srr)).epsilon(1e-12));
  CHECK(m.pearson_logp > 0.9); // small noise on a wide spread
  CHECK(m.out_of_band == doctest::Approx(out).epsilon(1e-12));
  CHECK(m.out_of_band > 0.0);
  CHECK(m.out_of_band < 1.0);
}

TEST_CASE("logprob_mismatch: identical log-probs have no mismatch") {
  batch x = random_batch(3, 6, 20);
  x.trainer = x.rollout;
  const rlpt::mismatch_metrics m = rlpt::logprob_mismatch(x.inputs());
  CHECK(m.tokens > 0.0);
  for (double v : {m.k1, m.k3, m.abs_diff_mean, m.abs_diff_max, m.prob_abs_diff_mean, m.prob_abs_diff_max,
                   m.prob_abs_diff_std, m.out_of_band, m.chi2_token, m.chi2_seq, m.log_ppl_diff, m.log_ppl_abs_diff,
                   m.log_ppl_diff_max, m.log_ppl_diff_min})
    CHECK(v == 0.0);
  CHECK(m.ppl_ratio == 1.0);
  CHECK(m.trainer_ppl == m.rollout_ppl);
  CHECK(m.pearson_logp == doctest::Approx(1.0).epsilon(1e-14));
  CHECK(m.pearson_prob == doctest::Approx(1.0).epsilon(1e-14));
}

TEST_CASE("logprob_mismatch: padded and packed layouts of one batch give the same bits") {
  const batch x = random_batch(5, 7, 16);
  std::vector<float> pt, pr;
  std::vector<index_t> offsets{0};
  for (index_t b = 0; b < x.B; ++b) {
    for (index_t t = 0; t < x.T; ++t) {
      const auto i = static_cast<std::size_t>(b * x.T + t);
      if (x.mask[i] == 0) break; // the valid prefix of each row
      pt.push_back(x.trainer[i]), pr.push_back(x.rollout[i]);
    }
    offsets.push_back(static_cast<index_t>(pt.size()));
  }
  const auto padded = rlpt::logprob_mismatch(x.inputs());
  const auto packed = rlpt::logprob_mismatch<float>(
      {.layout = rlpt::token_layout::packed(offsets), .trainer_logp = pt, .rollout_logp = pr}); // no mask: all valid
  check_same(padded, packed);
}

TEST_CASE("logprob_mismatch: rows without a valid token are left out of the sequence statistics") {
  const batch x = random_batch(8, 5, 12);
  batch y = x; // the same rows and one more, fully masked, holding garbage
  y.B += 1;
  for (index_t t = 0; t < x.T; ++t) {
    y.trainer.push_back(std::numeric_limits<float>::quiet_NaN());
    y.rollout.push_back(-30.0f);
    y.mask.push_back(0);
  }
  check_same(rlpt::logprob_mismatch(x.inputs()), rlpt::logprob_mismatch(y.inputs()));
}

TEST_CASE("logprob_mismatch: no valid token gives zeros, not NaN") {
  batch x = random_batch(2, 3, 4);
  std::fill(x.mask.begin(), x.mask.end(), mask_t{0});
  for (double v : all_of(rlpt::logprob_mismatch(x.inputs()))) CHECK(v == 0.0);
  const auto empty = rlpt::logprob_mismatch<float>({.layout = rlpt::token_layout::padded(0, 4)});
  CHECK(empty.tokens == 0.0);
  // one token: the spread and the correlations are undefined and reported as 0
  x.mask[0] = 1;
  const auto one = rlpt::logprob_mismatch(x.inputs());
  CHECK(one.tokens == 1.0);
  CHECK(one.prob_abs_diff_std == 0.0);
  CHECK(one.pearson_logp == 0.0);
  CHECK(one.pearson_prob == 0.0);
  CHECK(one.k1 == doctest::Approx(static_cast<double>(x.rollout[0]) - static_cast<double>(x.trainer[0])));
}

TEST_CASE("logprob_mismatch: non-finite log-probs at valid tokens raise, or are left out and counted") {
  batch x = random_batch(4, 4, 10);
  x.mask.assign(x.mask.size(), 1);
  x.rollout[13] = -std::numeric_limits<float>::infinity(); // sequence 1, position 3
  RLPT_CHECK_ERROR(rlpt::logprob_mismatch(x.inputs()), "rlpt.logprob.nonfinite", "rollout_logp[13]", "sequence 1",
                   "position 3", "nonfinite::mask");
  x.rollout[13] = -1.0f;
  x.trainer[25] = std::numeric_limits<float>::quiet_NaN();
  RLPT_CHECK_ERROR(rlpt::logprob_mismatch(x.inputs()), "rlpt.logprob.nonfinite", "trainer_logp[25]", "sequence 2",
                   "position 5");
  // a finite value whose exp overflows is no log-probability either (it would turn the
  // probability statistics into inf - inf)
  batch z = x;
  z.trainer[25] = -1.0f;
  z.trainer[30] = 800.0f;
  RLPT_CHECK_ERROR(rlpt::logprob_mismatch(z.inputs()), "rlpt.logprob.nonfinite", "trainer_logp[30] = 800",
                   "at most 700");
  const auto big = rlpt::logprob_mismatch(z.inputs(), {.nonfinite = rlpt::nonfinite::mask});
  CHECK(big.nonfinite_tokens == 1.0);
  for (double v : all_of(big)) CHECK(std::isfinite(v));
  // a finite log-prob far below the other: large but finite statistics, no NaN
  z.trainer[30] = -1.0f;
  z.rollout[31] = -1e30f;
  for (double v : all_of(rlpt::logprob_mismatch(z.inputs()))) CHECK(!std::isnan(v));
  const auto masked = rlpt::logprob_mismatch(x.inputs(), {.nonfinite = rlpt::nonfinite::mask});
  CHECK(masked.nonfinite_tokens == 1.0);
  batch y = x;
  y.mask[25] = 0;
  const auto without = rlpt::logprob_mismatch(y.inputs());
  CHECK(masked.tokens == without.tokens);
  rlpt::mismatch_metrics rest = masked;
  rest.nonfinite_tokens = 0.0; // the one difference
  check_same(rest, without);
}

TEST_CASE("logprob_mismatch: bad options and mis-sized views are named errors") {
  const batch x = random_batch(6, 3, 8);
  RLPT_CHECK_ERROR(rlpt::logprob_mismatch(x.inputs(), {.eps_low = 1.5}), "rlpt.logprob.bad_option", "eps_low = 1.5");
  RLPT_CHECK_ERROR(rlpt::logprob_mismatch(x.inputs(), {.eps_high = -0.1}), "rlpt.logprob.bad_option",
                   "eps_high = -0.1");
  RLPT_CHECK_ERROR(rlpt::logprob_mismatch(x.inputs(), {.log_ratio_clamp = 0.0}), "rlpt.logprob.bad_option",
                   "log_ratio_clamp = 0");
  auto in = x.inputs();
  const std::vector<float> short_rollout(x.rollout.begin(), x.rollout.end() - 1);
  in.rollout_logp = short_rollout;
  RLPT_CHECK_ERROR(rlpt::logprob_mismatch(in), "rlpt.view.size_mismatch", "rollout_logp", "23", "24");
  in = x.inputs();
  in.trainer_logp = {};
  RLPT_CHECK_ERROR(rlpt::logprob_mismatch(in), "rlpt.view.size_mismatch", "trainer_logp", "0", "24");
}

TEST_CASE("logprob_mismatch: fp64 log-probs") {
  const batch x = random_batch(9, 4, 10);
  std::vector<double> t(x.trainer.begin(), x.trainer.end()), r(x.rollout.begin(), x.rollout.end());
  const auto m64 = rlpt::logprob_mismatch<double>(
      {.layout = rlpt::token_layout::padded(x.B, x.T), .mask = x.mask, .trainer_logp = t, .rollout_logp = r});
  check_same(m64, rlpt::logprob_mismatch(x.inputs())); // the float values, exactly representable
}
