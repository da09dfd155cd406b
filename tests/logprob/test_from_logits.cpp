// SPDX-License-Identifier: Apache-2.0
// Logits -> logprob/entropy and its backward against fp64 references, finite differences,
// in-place equality and the declared handling of masked (-inf) vocabulary.
#include <rlpt/logprob.hpp>

#include "reference.hpp"
#include "support/random.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

using rlpt::index_t;
namespace lt = rlpt::test;

namespace {

// fp32 accumulation over V columns: lse carries ~V·eps absolute error at worst.
lt::tolerance tol_for(index_t vocab) { return {2e-5, 2e-6 * std::sqrt(static_cast<double>(vocab)) + 1e-5}; }

template <class T> struct batch {
  index_t rows, cols, stride;
  std::vector<T> logits;
  std::vector<index_t> targets;
};

template <class T> batch<T> make_batch(lt::rng& g, index_t rows, index_t cols, index_t pad = 0) {
  batch<T> b{rows, cols, cols + pad, {}, {}};
  b.logits = lt::random_logits<T>(g, static_cast<std::size_t>(rows * b.stride));
  for (index_t r = 0; r < rows; ++r) b.targets.push_back(g.integer(0, cols - 1));
  return b;
}

} // namespace

TEST_CASE_TEMPLATE("forward matches the fp64 reference for every logits dtype", T, float, double, rlpt::bf16,
                   rlpt::f16) {
  lt::rng g(1);
  for (const index_t cols : {1, 7, 16, 17, 511, 512, 513, 4099}) {
    auto b = make_batch<T>(g, 9, cols, cols % 3);
    b.targets[2] = -100; // ignore_index: not scored
    for (const float temp : {1.0f, 0.7f, 1.3f}) {
      std::vector<float> logp(9), ent(9), lse(9);
      std::vector<rlpt::mask_t> scored(9);
      const rlpt::view2d<const T> x(b.logits.data(), b.rows, b.cols, b.stride);
      const auto st = rlpt::logprob_entropy(
          x, b.targets, {.logp = logp, .entropy = ent, .saved = {.lse = lse}, .scored = scored}, {.temperature = temp});
      CHECK(st.scored == 8);
      CHECK(st.ignored == 1);
      std::vector<double> want_lp, want_ent, want_lse;
      for (index_t r = 0; r < b.rows; ++r) {
        const auto ref = lt::reference_row(lt::to_double(b.logits.data() + r * b.stride, cols), temp,
                                           b.targets[r] == -100 ? -1 : b.targets[r]);
        want_lp.push_back(ref.logp);
        want_ent.push_back(ref.entropy);
        want_lse.push_back(ref.lse);
        CHECK(scored[r] == (r == 2 ? 0 : 1));
      }
      INFO("cols " << cols << " temperature " << temp);
      RLPT_CHECK_CLOSE(logp, want_lp, tol_for(cols).rel, tol_for(cols).abs);
      RLPT_CHECK_CLOSE(ent, want_ent, tol_for(cols).rel, tol_for(cols).abs);
      RLPT_CHECK_CLOSE(lse, want_lse, tol_for(cols).rel, tol_for(cols).abs);
      CHECK(logp[2] == 0.0f);
    }
  }
}

TEST_CASE("forward is exact on a hand-computed row") {
  // logits (0, ln 2, ln 3, ln 4) at T = 1: p = (1, 2, 3, 4) / 10.
  const std::vector<float> x = {0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  const std::vector<index_t> t = {2};
  std::vector<float> logp(1), ent(1);
  rlpt::logprob_entropy(rlpt::view2d<const float>(x.data(), 1, 4), t, logp, ent);
  const double h = -(0.1 * std::log(0.1) + 0.2 * std::log(0.2) + 0.3 * std::log(0.3) + 0.4 * std::log(0.4));
  CHECK(logp[0] == doctest::Approx(std::log(0.3)).epsilon(1e-6));
  CHECK(ent[0] == doctest::Approx(h).epsilon(1e-6));
}

TEST_CASE("large logits (|z| ~ 1e4) keep full relative precision") {
  lt::rng g(2);
  auto b = make_batch<float>(g, 4, 1000);
  for (auto& v : b.logits) v = v + 10000.0f;
  std::vector<float> logp(4), ent(4);
  rlpt::logprob_entropy(rlpt::view2d<const float>(b.logits.data(), 4, 1000), b.targets, logp, ent);
  for (index_t r = 0; r < 4; ++r) {
    const auto ref = lt::reference_row(lt::to_double(b.logits.data() + r * 1000, 1000), 1.0, b.targets[r]);
    CHECK(logp[r] == doctest::Approx(ref.logp).epsilon(1e-4));
    // entropy uses the max-shifted sum, so the +1e4 offset costs nothing
    CHECK(ent[r] == doctest::Approx(ref.entropy).epsilon(1e-5));
  }
}

TEST_CASE("masked vocabulary (-inf logits) has probability exactly 0") {
  lt::rng g(3);
  auto b = make_batch<float>(g, 3, 300);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (index_t r = 0; r < 3; ++r)
    for (index_t j = 0; j < 300; j += 3) b.logits[r * 300 + j] = ninf;
  for (index_t r = 0; r < 3; ++r) b.targets[r] = 1 + 3 * r;
  std::vector<float> logp(3), ent(3), lse(3);
  const rlpt::view2d<const float> x(b.logits.data(), 3, 300);
  rlpt::logprob_entropy(x, b.targets, {.logp = logp, .entropy = ent, .saved = {.lse = lse}});
  std::vector<float> dl(3, 1.0f), dh(3, 0.5f), grad(900);
  rlpt::logprob_entropy_backward(x, b.targets, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}},
                                 rlpt::view2d<float>(grad.data(), 3, 300));
  for (index_t r = 0; r < 3; ++r) {
    const auto xd = lt::to_double(b.logits.data() + r * 300, 300);
    const auto ref = lt::reference_row(xd, 1.0, b.targets[r]);
    CHECK(logp[r] == doctest::Approx(ref.logp).epsilon(1e-5));
    CHECK(ent[r] == doctest::Approx(ref.entropy).epsilon(1e-5));
    for (index_t j = 0; j < 300; j += 3) CHECK(grad[r * 300 + j] == 0.0f);
    const auto want = lt::reference_grad(xd, 1.0, b.targets[r], 1.0, 0.5);
    std::vector<double> got(grad.begin() + r * 300, grad.begin() + (r + 1) * 300);
    RLPT_CHECK_CLOSE(got, want, 1e-4, 1e-6);
  }
}

TEST_CASE_TEMPLATE("backward matches the analytic fp64 gradient", T, float, double, rlpt::bf16, rlpt::f16) {
  lt::rng g(4);
  for (const index_t cols : {5, 16, 513, 2000}) {
    auto b = make_batch<T>(g, 6, cols, 5);
    b.targets[1] = -100;
    const rlpt::view2d<const T> x(b.logits.data(), b.rows, b.cols, b.stride);
    const float temp = 0.8f;
    std::vector<float> logp(6), ent(6), lse(6);
    rlpt::logprob_entropy(x, b.targets, {.logp = logp, .entropy = ent, .saved = {.lse = lse}}, {.temperature = temp});
    const auto dl = g.normals<float>(6), dh = g.normals<float>(6);
    std::vector<float> grad(static_cast<std::size_t>(6 * cols));
    const rlpt::view2d<float> gv(grad.data(), 6, cols);
    rlpt::logprob_entropy_backward(x, b.targets, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}},
                                   gv, {.temperature = temp});
    // without saved statistics the backward recomputes them: same result
    std::vector<float> grad2(grad.size());
    rlpt::logprob_entropy_backward(x, b.targets, {.dlogp = dl, .dentropy = dh},
                                   rlpt::view2d<float>(grad2.data(), 6, cols), {.temperature = temp});
    CHECK(grad == grad2);
    for (index_t r = 0; r < 6; ++r) {
      const auto want = lt::reference_grad(lt::to_double(b.logits.data() + r * b.stride, cols), temp,
                                           r == 1 ? -1 : b.targets[r], dl[r], dh[r]);
      std::vector<double> got(grad.begin() + r * cols, grad.begin() + (r + 1) * cols);
      INFO("cols " << cols << " row " << r);
      RLPT_CHECK_CLOSE(got, want, 1e-4, 1e-6);
    }
  }
}

TEST_CASE("backward equals central finite differences of the fp64 forward") {
  lt::rng g(5);
  const index_t cols = 40;
  const auto xs = lt::random_logits<double>(g, cols, 2.0);
  const index_t target = 7;
  const double temp = 0.9, dl = 0.7, dh = -1.3;
  const auto f = [&](const std::vector<double>& x) {
    const auto r = lt::reference_row(x, temp, target);
    return dl * r.logp + dh * r.entropy;
  };
  const auto fd = lt::finite_difference(f, xs);
  std::vector<float> logp(1), ent(1), lse(1), grad(cols);
  const rlpt::view2d<const double> x(xs.data(), 1, cols);
  const std::vector<index_t> t = {target};
  rlpt::logprob_entropy(x, t, {.logp = logp, .entropy = ent, .saved = {.lse = lse}},
                        {.temperature = static_cast<float>(temp)});
  const std::vector<float> dlv = {static_cast<float>(dl)}, dhv = {static_cast<float>(dh)};
  rlpt::logprob_entropy_backward(x, t, {.dlogp = dlv, .dentropy = dhv, .entropy = ent, .saved = {.lse = lse}},
                                 rlpt::view2d<float>(grad.data(), 1, cols), {.temperature = static_cast<float>(temp)});
  RLPT_CHECK_CLOSE(grad, fd, 1e-4, 1e-6);
}

TEST_CASE_TEMPLATE("in-place backward equals out-of-place bit for bit", T, float, rlpt::bf16, rlpt::f16) {
  lt::rng g(6);
  auto b = make_batch<T>(g, 5, 1031, 9);
  const rlpt::view2d<const T> x(b.logits.data(), b.rows, b.cols, b.stride);
  std::vector<float> logp(5), ent(5), lse(5);
  rlpt::logprob_entropy(x, b.targets, {.logp = logp, .entropy = ent, .saved = {.lse = lse}});
  const auto dl = g.normals<float>(5), dh = g.normals<float>(5);
  std::vector<T> out(b.logits.size());
  rlpt::logprob_entropy_backward(x, b.targets, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}},
                                 rlpt::view2d<T>(out.data(), 5, 1031, 1040));
  auto inplace = b.logits;
  const rlpt::view2d<T> w(inplace.data(), 5, 1031, 1040);
  rlpt::logprob_entropy_backward(rlpt::view2d<const T>(w), b.targets,
                                 {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}}, w);
  for (index_t r = 0; r < 5; ++r)
    for (index_t j = 0; j < 1031; ++j) {
      const auto i = static_cast<std::size_t>(r * 1040 + j);
      if (std::memcmp(&out[i], &inplace[i], sizeof(T)) != 0) {
        FAIL_CHECK("row " << r << " col " << j << " differs");
        return;
      }
    }
  // the padding between rows is never touched
  for (index_t r = 0; r < 5; ++r)
    for (index_t j = 1031; j < 1040; ++j) {
      const auto i = static_cast<std::size_t>(r * 1040 + j);
      CHECK(std::memcmp(&inplace[i], &b.logits[i], sizeof(T)) == 0);
    }
}

TEST_CASE("bf16 gradients round to nearest even like rlpt::bf16") {
  lt::rng g(7);
  auto b = make_batch<float>(g, 3, 700);
  const rlpt::view2d<const float> x(b.logits.data(), 3, 700);
  std::vector<float> logp(3), ent(3), lse(3);
  rlpt::logprob_entropy(x, b.targets, {.logp = logp, .entropy = ent, .saved = {.lse = lse}});
  const auto dl = g.normals<float>(3), dh = g.normals<float>(3);
  std::vector<float> g32(2100);
  std::vector<rlpt::bf16> g16(2100);
  rlpt::logprob_entropy_backward(x, b.targets, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}},
                                 rlpt::view2d<float>(g32.data(), 3, 700));
  rlpt::logprob_entropy_backward(x, b.targets, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}},
                                 rlpt::view2d<rlpt::bf16>(g16.data(), 3, 700));
  for (std::size_t i = 0; i < g32.size(); ++i) CHECK(g16[i].bits == rlpt::bf16(g32[i]).bits);
}
