// SPDX-License-Identifier: Apache-2.0
// Runs an rlpt objective on a golden case (inputs written by tools/golden/gen_objective.py) in
// float and double, and compares loss and gradients with the peer's float32 and float64 autograd.
//
// fp64: rlpt double vs the peer's float64 run, 1e-9 relative (the same formula without fp32
// rounding: this is the conformance check). fp32: rlpt float vs the peer's float32 run, within
// 1e-6 relative plus twice the peer's own fp32 error |p32 - p64| (the peer's loss can carry
// more than 1e-6 of rounding where positive and negative advantages cancel), and rlpt's own fp32
// error |o32 - o64| must stay within the same bound (rlpt is at least as accurate as the peer).
#pragma once

#include <rlpt/objective.hpp>

#include "support/golden.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

namespace rlpt::test {

struct golden_case {
  std::vector<std::uint8_t> mask;
  std::vector<double> lp, old, behav, ref, adv, entropy, values, old_values, returns;
  std::vector<double> loss32, grad_logp32, grad_entropy32, grad_values32;
  std::vector<double> loss64, grad_logp64, grad_entropy64, grad_values64;
  index_t B = 0, T = 0;

  explicit golden_case(const std::string& name) {
    golden_file f(golden_path("objective", name + ".bin"));
    const auto& shape = f["lp"].shape;
    B = static_cast<index_t>(shape.at(0));
    T = static_cast<index_t>(shape.at(1));
    mask = f.get<std::uint8_t>("mask");
    for (auto [dst, key] : {std::pair{&lp, "lp"},
                            {&old, "old"},
                            {&behav, "behav"},
                            {&ref, "ref"},
                            {&adv, "adv"},
                            {&entropy, "entropy"},
                            {&values, "values"},
                            {&old_values, "old_values"},
                            {&returns, "returns"},
                            {&loss32, "loss"},
                            {&grad_logp32, "grad_logp"},
                            {&grad_entropy32, "grad_entropy"},
                            {&grad_values32, "grad_values"},
                            {&loss64, "loss_64"},
                            {&grad_logp64, "grad_logp_64"},
                            {&grad_entropy64, "grad_entropy_64"},
                            {&grad_values64, "grad_values_64"}})
      *dst = f.get<double>(key);
  }
};

//! Which inputs a case passes to rlpt (absent ones stay empty).
struct golden_inputs {
  bool old = true, behav = false, ref = false, entropy = false, values = false;
  bool seq_adv = false; //!< pass adv[:, 0] as per-sequence advantages
};

template <class T> struct typed_inputs {
  std::vector<T> lp, old, behav, ref, adv, seq_adv, entropy, values, old_values, returns;
  std::vector<T> g_logp, g_entropy, g_values;

  template <class V> static std::vector<T> cast(const V& v) {
    std::vector<T> out(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) out[i] = static_cast<T>(v[i]);
    return out;
  }

  typed_inputs(const golden_case& g, const golden_inputs& w) {
    lp = cast(g.lp);
    if (w.old) old = cast(g.old);
    if (w.behav) behav = cast(g.behav);
    if (w.ref) ref = cast(g.ref);
    if (w.seq_adv) {
      for (index_t b = 0; b < g.B; ++b) seq_adv.push_back(static_cast<T>(g.adv[static_cast<std::size_t>(b * g.T)]));
    } else {
      adv = cast(g.adv);
    }
    if (w.entropy) entropy = cast(g.entropy);
    if (w.values) {
      values = cast(g.values);
      old_values = cast(g.old_values);
      returns = cast(g.returns);
    }
    g_logp.assign(g.lp.size(), T(7));
    g_entropy.assign(g.lp.size(), T(7));
    g_values.assign(g.lp.size(), T(7));
  }

  objective_result run(const objective& obj, const golden_case& g) {
    basic_objective_inputs<T> in{.layout = token_layout::padded(g.B, g.T),
                                 .mask = g.mask,
                                 .logp = lp,
                                 .old_logp = old,
                                 .behav_logp = behav,
                                 .ref_logp = ref,
                                 .adv = adv,
                                 .seq_adv = seq_adv,
                                 .entropy = entropy,
                                 .values = values,
                                 .old_values = old_values,
                                 .returns = returns};
    return evaluate(obj, in, basic_objective_grads<T>{.logp = g_logp, .entropy = g_entropy, .values = g_values});
  }
};

//! Returns a description of the first element that breaks the bounds, or "".
inline std::string compare_golden(const std::string& what, const std::vector<double>& o32,
                                  const std::vector<double>& o64, const std::vector<double>& p32,
                                  const std::vector<double>& p64, bool peer_fp32_only = false) {
  if (o32.size() != p32.size() || o64.size() != p64.size())
    return fmt::format("{}: size {} / {} vs golden {} / {}", what, o32.size(), o64.size(), p32.size(), p64.size());
  double scale = 0.0;
  for (double v : p64) scale = std::max(scale, std::fabs(v));
  for (std::size_t i = 0; i < p64.size(); ++i) {
    const double peer_err = std::fabs(p32[i] - p64[i]);
    // A peer that computes in float32 even on float64 inputs (OpenRLHF's compute_approx_kl upcasts
    // to .float(); TRL's SAPO temperatures are float32 tensors) only allows the fp32 bound.
    // Such a peer also loses digits to fp32 cancellation in differences like logp - ref_logp, so its
    // bounds carry an absolute floor of 1e-6 of the array's scale instead of 1e-7.
    const double floor = peer_fp32_only ? 1e-6 * scale : 1e-7 * scale;
    const double tol64 = peer_fp32_only ? 1e-6 * std::fabs(p64[i]) + floor : 1e-9 * std::fabs(p64[i]) + 1e-12 * scale;
    if (!(std::fabs(o64[i] - p64[i]) <= tol64))
      return fmt::format("{}[{}] fp64: rlpt {:.17g} vs peer {:.17g} (diff {:.3g}, tol {:.3g})", what, i, o64[i], p64[i],
                         std::fabs(o64[i] - p64[i]), tol64);
    const double tol32 = 1e-6 * std::fabs(p32[i]) + 2.0 * peer_err + floor;
    if (!(std::fabs(o32[i] - p32[i]) <= tol32))
      return fmt::format("{}[{}] fp32: rlpt {:.9g} vs peer {:.9g} (diff {:.3g}, tol {:.3g}, peer fp32 error {:.3g})",
                         what, i, o32[i], p32[i], std::fabs(o32[i] - p32[i]), tol32, peer_err);
    const double own = 1e-6 * std::fabs(o64[i]) + 2.0 * peer_err + floor;
    if (!(std::fabs(o32[i] - o64[i]) <= own))
      return fmt::format("{}[{}] rlpt fp32 error {:.3g} exceeds {:.3g} (fp32 {:.9g}, fp64 {:.17g})", what, i,
                         std::fabs(o32[i] - o64[i]), own, o32[i], o64[i]);
  }
  return {};
}

template <class T> std::vector<double> as_double(const std::vector<T>& v) { return {v.begin(), v.end()}; }

struct golden_outcome {
  objective_result r32, r64;
};

//! Runs `obj` on the case in float and double and CHECKs loss and gradients against the golden.
inline golden_outcome check_golden_case(const std::string& name, const objective& obj, const golden_inputs& w,
                                        bool check_entropy_grad = false, bool check_value_grad = false,
                                        bool peer_fp32_only = false) {
  INFO("golden case ", name);
  const golden_case g(name);
  typed_inputs<float> f(g, w);
  typed_inputs<double> d(g, w);
  golden_outcome out;
  out.r32 = f.run(obj, g);
  out.r64 = d.run(obj, g);
  std::string m = compare_golden("loss", {out.r32.loss}, {out.r64.loss}, g.loss32, g.loss64, peer_fp32_only);
  CHECK_MESSAGE(m.empty(), m);
  m = compare_golden("grad_logp", as_double(f.g_logp), d.g_logp, g.grad_logp32, g.grad_logp64, peer_fp32_only);
  CHECK_MESSAGE(m.empty(), m);
  if (check_entropy_grad) {
    m = compare_golden("grad_entropy", as_double(f.g_entropy), d.g_entropy, g.grad_entropy32, g.grad_entropy64,
                       peer_fp32_only);
    CHECK_MESSAGE(m.empty(), m);
  }
  if (check_value_grad) {
    m = compare_golden("grad_values", as_double(f.g_values), d.g_values, g.grad_values32, g.grad_values64,
                       peer_fp32_only);
    CHECK_MESSAGE(m.empty(), m);
  }
  return out;
}

} // namespace rlpt::test
