// SPDX-License-Identifier: Apache-2.0
// Seeded random batches for the objective tests: a padded [B, T] batch (row stride > T, right
// padding, interior mask holes, an empty row) with every input an objective can read.
#pragma once

#include <rlpt/objective.hpp>

#include "support/random.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace rlpt::test {

template <class T> struct batch {
  index_t B = 0, L = 0, stride = 0;
  std::vector<mask_t> mask;
  std::vector<T> lp, old, behav, ref, adv, entropy, values, old_values, returns, teachers;
  std::vector<T> seq_adv;
  std::vector<mask_t> in_denominator; //!< seq_in_denominator when not empty
  int n_teachers = 2;

  batch(index_t b, index_t len, std::uint64_t stream, double gap = 0.3, double behav_gap = 0.2) : B(b), L(len) {
    stride = len + 3;
    const auto n = static_cast<std::size_t>(B * stride);
    rng r(stream);
    mask.assign(n, 0);
    lp = r.normals<T>(n, -1.5, 0.8);
    old = lp;
    behav = lp;
    ref = lp;
    adv = r.normals<T>(n);
    entropy = r.uniforms<T>(n, 0.0, 3.0);
    values = r.normals<T>(n);
    old_values = values;
    returns = r.normals<T>(n);
    teachers.assign(static_cast<std::size_t>(n_teachers) * n, T(0));
    for (index_t s = 0; s < B; ++s) {
      const index_t len_s = s == 1 ? 0 : r.integer(1, len);
      const T a = static_cast<T>(r.normal());
      seq_adv.push_back(a);
      for (index_t t = 0; t < stride; ++t) {
        const auto i = static_cast<std::size_t>(s * stride + t);
        mask[i] = (t < len_s && !(t > 0 && r.bernoulli(0.1))) ? 1 : 0;
        old[i] = static_cast<T>(static_cast<double>(lp[i]) + r.normal(0.0, gap));
        behav[i] = static_cast<T>(static_cast<double>(old[i]) + r.normal(0.0, behav_gap));
        ref[i] = static_cast<T>(static_cast<double>(lp[i]) + r.normal(0.0, 0.4));
        old_values[i] = static_cast<T>(static_cast<double>(values[i]) + r.normal(0.0, 0.6));
        if (r.bernoulli(0.5)) adv[i] = a; // a mix of per-sequence and per-token advantages
        for (int k = 0; k < n_teachers; ++k)
          teachers[static_cast<std::size_t>(k) * n + i] =
              static_cast<T>(static_cast<double>(lp[i]) + r.normal(0.0, 0.5));
      }
    }
  }

  [[nodiscard]] std::size_t size() const { return lp.size(); }

  [[nodiscard]] basic_objective_inputs<T> inputs() const {
    basic_objective_inputs<T> in;
    in.layout = token_layout::padded(B, L, stride);
    in.mask = mask;
    in.logp = lp;
    in.old_logp = old;
    in.behav_logp = behav;
    in.ref_logp = ref;
    in.adv = adv;
    in.entropy = entropy;
    in.values = values;
    in.old_values = old_values;
    in.returns = returns;
    in.teacher_logp = view2d<const T>(teachers.data(), n_teachers, static_cast<index_t>(size()));
    in.seq_in_denominator = in_denominator;
    return in;
  }
};

//! Gradient buffers pre-filled with a sentinel, so a slot the call forgot to write shows.
template <class T> struct grads {
  std::vector<T> logp, entropy, values;
  explicit grads(std::size_t n) : logp(n, T(-777)), entropy(n, T(-777)), values(n, T(-777)) {}
  basic_objective_grads<T> view() { return {.logp = logp, .entropy = entropy, .values = values}; }
};

} // namespace rlpt::test
