// SPDX-License-Identifier: Apache-2.0
// M2PO's token selection (AReaL m2_threshold) against its definition, by hand and by brute force.
#include <rlpt/objective.hpp>

#include "batch.hpp"
#include "support/errors.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using namespace rlpt;
using rlpt::test::batch;

namespace {

//! The definition, by brute force: the least k for which the mean M2 of the valid tokens left
//! after dropping the k largest (equal values: the earlier slot first) is below the threshold,
//! each mean summed afresh; all but one when there is none.
std::vector<mask_t> m2po_reference(const batch<double>& b, double threshold) {
  std::vector<std::size_t> slots;
  std::vector<double> m2(b.size(), 0.0);
  for (index_t s = 0; s < b.B; ++s)
    for (index_t t = 0; t < b.L; ++t) {
      const auto i = static_cast<std::size_t>(s * b.stride + t);
      if (b.mask[i] == 0) continue;
      const double d = b.old[i] - b.behav[i];
      m2[i] = d * d;
      slots.push_back(i);
    }
  std::vector<mask_t> keep(b.size(), 0);
  if (slots.empty()) return keep;
  std::vector<std::size_t> order = slots;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return m2[x] > m2[y]; });
  std::size_t drop = order.size() - 1;
  for (std::size_t k = 0; k < order.size(); ++k) {
    double sum = 0.0;
    for (std::size_t j = k; j < order.size(); ++j) sum += m2[order[j]];
    if (sum / static_cast<double>(order.size() - k) < threshold) {
      drop = k;
      break;
    }
  }
  for (std::size_t i : slots) keep[i] = 1;
  for (std::size_t k = 0; k < drop; ++k) keep[order[k]] = 0;
  return keep;
}

} // namespace

TEST_CASE("m2po_mask: by hand, the least number of largest second moments to drop") {
  // M2 = 4, 1, 0.25, 0.01 and 0 (a masked slot with a larger one in between): the means after
  // dropping 0, 1, 2 are 1.052, 0.315 and 0.0867, so a threshold of 0.3 drops the two largest.
  const std::vector<mask_t> mask{1, 1, 0, 1, 1, 1};
  const std::vector<double> old{0.0, -1.0, 0.0, 0.5, 0.1, -2.0};
  const std::vector<double> behav{2.0, 0.0, 9.0, 0.0, 0.0, -2.0};
  const basic_objective_inputs<double> in{
      .layout = token_layout::padded(2, 3), .mask = mask, .old_logp = old, .behav_logp = behav};
  std::vector<mask_t> out(6, 7);
  CHECK(m2po_mask(in, 0.3, out) == 2);
  CHECK(out == std::vector<mask_t>{0, 0, 0, 1, 1, 1});
  CHECK(m2po_mask(in, 0.32, out) == 1); // 0.315 < 0.32
  CHECK(out == std::vector<mask_t>{0, 1, 0, 1, 1, 1});
  CHECK(m2po_mask(in, 2.0, out) == 0);
  CHECK(out == mask);
  // Only the last token alone (M2 = 0) is below 1e-300: the four largest go.
  CHECK(m2po_mask(in, 1e-300, out) == 4);
  CHECK(out == std::vector<mask_t>{0, 0, 0, 0, 0, 1});
  // No k brings the mean below the threshold (M2 = 4 and 1, means 2.5 and 1): AReaL keeps one token,
  // the smallest.
  const std::vector<double> two_old{0.0, 0.0}, two_behav{2.0, 1.0};
  const basic_objective_inputs<double> two{
      .layout = token_layout::padded(1, 2), .old_logp = two_old, .behav_logp = two_behav};
  std::vector<mask_t> two_out(2);
  CHECK(m2po_mask(two, 0.5, two_out) == 1);
  CHECK(two_out == std::vector<mask_t>{0, 1});
  // Equal second moments: the earlier slot goes first.
  const std::vector<double> tie_behav{1.0, 0.0, 0.0, -0.5, 0.0, -2.0}; // M2 = 1, 1, -, 1, 0.01, 0
  const basic_objective_inputs<double> tie{
      .layout = token_layout::padded(2, 3), .mask = mask, .old_logp = old, .behav_logp = tie_behav};
  CHECK(m2po_mask(tie, 0.5, out) == 2); // means 0.602, 0.5025, 0.3367
  CHECK(out == std::vector<mask_t>{0, 0, 0, 1, 1, 1});
}

TEST_CASE("m2po_mask equals its definition on seeded batches, padded and packed") {
  for (std::uint64_t seed : {3u, 4u, 5u}) {
    const batch<double> b(11, 37, seed, 0.3, 0.4 * static_cast<double>(seed - 2));
    for (double threshold : {1e-4, 0.01, 0.05, 0.2, 10.0}) {
      INFO("seed ", seed, ", threshold ", threshold);
      const std::vector<mask_t> want = m2po_reference(b, threshold);
      std::vector<mask_t> out(b.size(), 9);
      const index_t dropped = m2po_mask(b.inputs(), threshold, out);
      CHECK(out == want);
      index_t valid = 0, kept = 0;
      double kept_m2 = 0.0;
      for (std::size_t i = 0; i < b.size(); ++i) {
        valid += b.mask[i] != 0 && static_cast<index_t>(i) % b.stride < b.L ? 1 : 0;
        kept += out[i];
        if (out[i] != 0) kept_m2 += (b.old[i] - b.behav[i]) * (b.old[i] - b.behav[i]);
      }
      CHECK(dropped == valid - kept);
      CHECK((kept_m2 / static_cast<double>(kept) < threshold || kept == 1));
    }
  }
  // Packed: the same tokens back to back (no stride gap) keep the same ones.
  const batch<double> b(6, 20, 8, 0.3, 0.5);
  std::vector<index_t> offsets{0};
  std::vector<mask_t> mask;
  std::vector<double> old, behav;
  std::vector<std::size_t> from;
  for (index_t s = 0; s < b.B; ++s) {
    for (index_t t = 0; t < b.L; ++t) {
      const auto i = static_cast<std::size_t>(s * b.stride + t);
      mask.push_back(b.mask[i]);
      old.push_back(b.old[i]);
      behav.push_back(b.behav[i]);
      from.push_back(i);
    }
    offsets.push_back(static_cast<index_t>(mask.size()));
  }
  const basic_objective_inputs<double> packed{
      .layout = token_layout::packed(offsets), .mask = mask, .old_logp = old, .behav_logp = behav};
  std::vector<mask_t> out(mask.size()), padded_out(b.size());
  CHECK(m2po_mask(packed, 0.03, out) > 0);
  m2po_mask(b.inputs(), 0.03, padded_out);
  for (std::size_t j = 0; j < out.size(); ++j) CHECK(out[j] == padded_out[from[j]]);
}

TEST_CASE("m2po_mask: bad input gets a named error") {
  const std::vector<mask_t> mask{1, 1, 1};
  const std::vector<double> old{0.0, -1.0, 0.0};
  std::vector<double> behav{0.5, 0.0, 0.0};
  const basic_objective_inputs<double> in{
      .layout = token_layout::padded(1, 3), .mask = mask, .old_logp = old, .behav_logp = behav};
  std::vector<mask_t> out(3);
  RLPT_CHECK_ERROR(m2po_mask(in, 0.0, out), "rlpt.objective.bad_option", "m2_threshold = 0");
  RLPT_CHECK_ERROR(m2po_mask(in, std::numeric_limits<double>::quiet_NaN(), out), "rlpt.objective.bad_option",
                   "m2_threshold = nan");
  basic_objective_inputs<double> no_behav = in;
  no_behav.behav_logp = {};
  RLPT_CHECK_ERROR(m2po_mask(no_behav, 0.1, out), "rlpt.objective.missing_input", "behav_logp");
  std::vector<mask_t> short_out(2);
  RLPT_CHECK_ERROR(m2po_mask(in, 0.1, short_out), "rlpt.view.size_mismatch", "m2po_mask out");
  behav[1] = std::numeric_limits<double>::infinity();
  std::fill(out.begin(), out.end(), mask_t{5});
  RLPT_CHECK_ERROR(m2po_mask(in, 0.1, out), "rlpt.objective.nonfinite", "behav_logp[1] = inf");
  CHECK(out == std::vector<mask_t>{5, 5, 5}); // a refused call writes nothing
  // An empty batch drops nothing.
  const basic_objective_inputs<double> empty{.layout = token_layout::padded(0, 3)};
  std::vector<mask_t> none;
  CHECK(m2po_mask(empty, 0.1, none) == 0);
}
