// SPDX-License-Identifier: Apache-2.0
// fp64 references for the logprob tests: explicit softmax, explicit sort for top-k/top-p,
// analytic gradients, and central finite differences.
#pragma once

#include <rlpt/core/dtype.hpp>
#include <rlpt/core/views.hpp>

#include "support/random.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <vector>

namespace rlpt::test {

struct ref_row {
  double logp = 0;    // log-prob of the target (0 when no target; -inf when dropped)
  double entropy = 0; // entropy of the (truncated) distribution
  double lse = 0;     // log-sum-exp over the kept support
  std::vector<std::uint8_t> kept;
  std::vector<double> p; // probabilities over the kept support (0 elsewhere)
};

//! Reference for one row, as the engines do it with masks: z = x / T; min-p (p_j >= min_p · max p,
//! as exp(z_j − m) >= min_p) first when min_p_first (vLLM: the columns it drops are −inf for
//! top-k); top-k (ties kept); top-p (sorted by z desc, id asc; a token is kept while the mass
//! before it is < p·S_K); min-p last otherwise (SGLang, Hugging Face); renormalised.
inline ref_row reference_row(const std::vector<double>& x, double temperature, std::int64_t target,
                             std::int64_t top_k = 0, double top_p = 1.0, double min_p = 0.0, bool min_p_first = true) {
  const auto n = static_cast<std::int64_t>(x.size());
  std::vector<double> z(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) z[j] = x[j] / temperature;
  std::vector<std::int64_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return z[a] > z[b]; });
  ref_row r;
  r.kept.assign(x.size(), 1);
  const double m = z[order[0]];
  const auto apply_min_p = [&] {
    if (min_p > 0.0)
      for (std::int64_t j = 0; j < n; ++j)
        if (!(std::exp(z[j] - m) >= min_p)) r.kept[j] = 0;
  };
  if (min_p_first) apply_min_p();
  if (top_k > 0 && top_k < n) {
    // the k-th largest with the dropped columns at −inf (engines mask before top-k)
    std::vector<double> zk(z);
    for (std::int64_t j = 0; j < n; ++j)
      if (!r.kept[j]) zk[j] = -std::numeric_limits<double>::infinity();
    std::vector<double> sorted(zk);
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    const double kth = sorted[static_cast<std::size_t>(top_k - 1)];
    for (std::int64_t j = 0; j < n; ++j) r.kept[j] = r.kept[j] && zk[j] >= kth ? 1 : 0;
  }
  if (top_p < 1.0) {
    double total = 0;
    for (std::int64_t j = 0; j < n; ++j)
      if (r.kept[j]) total += std::exp(z[j] - m);
    double before = 0;
    std::vector<std::uint8_t> keep(x.size(), 0);
    for (std::int64_t j : order) {
      if (!r.kept[j]) continue;
      if (before < top_p * total || before == 0) keep[j] = 1;
      before += std::exp(z[j] - m);
    }
    r.kept = keep;
  }
  if (!min_p_first) apply_min_p();
  double s = 0, a = 0;
  for (std::int64_t j = 0; j < n; ++j)
    if (r.kept[j] && z[j] != -std::numeric_limits<double>::infinity()) {
      const double e = std::exp(z[j] - m);
      s += e;
      a += e * (z[j] - m);
    }
  r.lse = m + std::log(s);
  r.entropy = std::log(s) - a / s;
  r.p.assign(x.size(), 0.0);
  for (std::int64_t j = 0; j < n; ++j)
    if (r.kept[j]) r.p[j] = std::exp(z[j] - r.lse); // exp(-inf) = 0
  if (target >= 0) r.logp = r.kept[target] ? z[target] - r.lse : -std::numeric_limits<double>::infinity();
  return r;
}

//! d(dlogp·logp + dentropy·entropy)/dx for one row, analytically (support held fixed). A row
//! without a target (target < 0) takes no dlogp term at all.
inline std::vector<double> reference_grad(const std::vector<double>& x, double temperature, std::int64_t target,
                                          double dlogp, double dentropy, std::int64_t top_k = 0, double top_p = 1.0,
                                          double min_p = 0.0, bool min_p_first = true) {
  const ref_row r = reference_row(x, temperature, target, top_k, top_p, min_p, min_p_first);
  std::vector<double> g(x.size(), 0.0);
  if (target < 0) dlogp = 0.0;
  for (std::size_t j = 0; j < x.size(); ++j) {
    if (!r.kept[j] || r.p[j] == 0.0) continue;
    const double logp_j = x[j] / temperature - r.lse;
    g[j] = (-dlogp * r.p[j] - dentropy * r.p[j] * (logp_j + r.entropy)) / temperature;
  }
  const bool target_ok = target >= 0 && r.kept[target] && std::isfinite(r.logp);
  if (target_ok) g[target] += dlogp / temperature;
  return g;
}

//! Central finite difference of f at x along each coordinate.
inline std::vector<double> finite_difference(const std::function<double(const std::vector<double>&)>& f,
                                             std::vector<double> x, double h = 1e-5) {
  std::vector<double> g(x.size());
  for (std::size_t j = 0; j < x.size(); ++j) {
    const double keep = x[j];
    x[j] = keep + h;
    const double up = f(x);
    x[j] = keep - h;
    const double down = f(x);
    x[j] = keep;
    g[j] = (up - down) / (2 * h);
  }
  return g;
}

//! Converts a row of any logit type to double exactly.
template <class T> std::vector<double> to_double(const T* p, std::int64_t n) {
  std::vector<double> r(static_cast<std::size_t>(n));
  for (std::int64_t j = 0; j < n; ++j) r[static_cast<std::size_t>(j)] = static_cast<double>(static_cast<float>(p[j]));
  return r;
}
template <> inline std::vector<double> to_double<double>(const double* p, std::int64_t n) { return {p, p + n}; }

//! Seeded logits of type T with a spread typical of LM heads (normal, scale `sd`).
template <class T> std::vector<T> random_logits(rng& g, std::size_t n, double sd = 3.0) {
  std::vector<T> v(n);
  for (auto& e : v) e = T(static_cast<float>(g.normal(0.0, sd)));
  return v;
}
template <> inline std::vector<double> random_logits<double>(rng& g, std::size_t n, double sd) {
  std::vector<double> v(n);
  for (auto& e : v) e = g.normal(0.0, sd);
  return v;
}

} // namespace rlpt::test
