// SPDX-License-Identifier: Apache-2.0
// Golden vectors from the peers' own functions (tools/golden/gen_logprob.py): torch
// log_softmax+gather / entropy / autograd, verl's and TRL's logprob and entropy helpers, and
// Hugging Face's top-k/top-p warpers for the sampling-consistent mode.
#include <rlpt/logprob.hpp>

#include "support/golden.hpp"
#include "support/reference.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

using rlpt::index_t;
namespace lt = rlpt::test;

namespace {

template <class T> void check_from_logits_file(const char* file) {
  const lt::golden_file f(lt::golden_path("logprob", file));
  const auto& shape = f["logits"].shape;
  const auto n = static_cast<index_t>(shape[0]), v = static_cast<index_t>(shape[1]);
  const auto xf = f.get<float>("logits");
  std::vector<T> x(xf.size());
  for (std::size_t i = 0; i < xf.size(); ++i) x[i] = T(xf[i]); // exact: the values are representable
  const auto t = f.get<index_t>("targets");
  const auto temp = static_cast<float>(f.get<double>("temperature")[0]);
  std::vector<float> logp(n), ent(n), lse(n);
  const rlpt::view2d<const T> xv(x.data(), n, v);
  rlpt::logprob_entropy(xv, t, {.logp = logp, .entropy = ent, .saved = {.lse = lse}}, {.temperature = temp});
  INFO(file);
  const auto torch_lp = f.get<double>("torch_logp_f64"), torch_ent = f.get<double>("torch_entropy_f64");
  RLPT_CHECK_CLOSE(logp, torch_lp, 1e-5, 2e-5);
  RLPT_CHECK_CLOSE(ent, torch_ent, 1e-5, 2e-5);
  // the fp32 peers carry their own rounding: compare at fp32 accuracy
  for (const char* peer : {"torch_logp_f32", "verl_logp", "trl_logp"}) {
    const auto want = f.get<float>(peer);
    INFO(std::string(peer));
    RLPT_CHECK_CLOSE(logp, want, 1e-5, 1e-4);
  }
  for (const char* peer : {"torch_entropy_f32", "verl_entropy", "trl_entropy"}) {
    // TRL's entropy_from_logits computes Σ exp(logp)·logp and returns NaN for a row with masked
    // (−inf) vocabulary (0·−inf): compare the other rows, and require that row to be the only one
    const auto want = f.get<float>(peer);
    std::vector<float> got_ok, want_ok;
    index_t nan_rows = 0;
    for (index_t r = 0; r < n; ++r) {
      if (std::isnan(want[static_cast<std::size_t>(r)])) {
        ++nan_rows;
        CHECK(r == 1);
        continue;
      }
      got_ok.push_back(ent[r]);
      want_ok.push_back(want[static_cast<std::size_t>(r)]);
    }
    INFO(std::string(peer) << " NaN rows " << nan_rows);
    CHECK(nan_rows <= 1);
    RLPT_CHECK_CLOSE(got_ok, want_ok, 1e-5, 1e-4);
  }
  const auto dl = f.get<float>("dlogp"), dh = f.get<float>("dentropy");
  std::vector<float> grad(static_cast<std::size_t>(n * v));
  rlpt::logprob_entropy_backward(xv, t, {.dlogp = dl, .dentropy = dh, .entropy = ent, .saved = {.lse = lse}},
                                 rlpt::view2d<float>(grad.data(), n, v), {.temperature = temp});
  const auto torch_grad = f.get<float>("torch_grad");
  RLPT_CHECK_CLOSE(grad, torch_grad, 1e-4, 1e-7);
}

} // namespace

TEST_CASE("golden: fp32 logits against torch, verl and TRL") { check_from_logits_file<float>("from_logits.bin"); }

TEST_CASE("golden: bf16 logits against torch, verl and TRL on the upcast values") {
  check_from_logits_file<rlpt::bf16>("from_bf16.bin");
}

TEST_CASE("golden: top-k / top-p against Hugging Face's logits warpers") {
  const lt::golden_file f(lt::golden_path("logprob", "sampled.bin"));
  const auto& shape = f["logits"].shape;
  const auto n = static_cast<index_t>(shape[0]), v = static_cast<index_t>(shape[1]);
  const auto x = f.get<float>("logits");
  for (int c = 0; c < 4; ++c) {
    const std::string p = "case" + std::to_string(c) + "_";
    const auto params = f.get<double>(p + "params");
    const rlpt::logprob_options o{.temperature = static_cast<float>(params[0]),
                                  .top_k = static_cast<index_t>(params[1]),
                                  .top_p = static_cast<float>(params[2])};
    const auto t = f.get<index_t>(p + "targets");
    std::vector<float> logp(n), ent(n);
    std::vector<rlpt::mask_t> kept(static_cast<std::size_t>(n * v));
    rlpt::logprob_entropy(rlpt::view2d<const float>(x.data(), n, v), t,
                          {.logp = logp, .entropy = ent, .kept = rlpt::view2d<rlpt::mask_t>(kept.data(), n, v)}, o);
    INFO("T " << o.temperature << " top_k " << o.top_k << " top_p " << o.top_p);
    CHECK(kept == f.get<rlpt::mask_t>(p + "kept"));
    const auto want_lp = f.get<double>(p + "logp"), want_ent = f.get<double>(p + "entropy");
    RLPT_CHECK_CLOSE(logp, want_lp, 1e-5, 2e-5);
    RLPT_CHECK_CLOSE(ent, want_ent, 1e-5, 2e-5);
  }
}

TEST_CASE("golden: min-p against Hugging Face's MinPLogitsWarper, in generate()'s order and in vLLM's") {
  const lt::golden_file f(lt::golden_path("logprob", "sampled_min_p.bin"));
  const auto n = static_cast<index_t>(f["logits"].shape[0]), v = static_cast<index_t>(f["logits"].shape[1]);
  const auto x = f.get<float>("logits");
  for (int c = 0; c < 6; ++c) {
    const std::string p = "case" + std::to_string(c) + "_";
    const auto params = f.get<double>(p + "params");
    const auto temp = static_cast<float>(params[0]);
    const auto k = static_cast<index_t>(params[1]);
    const auto top_p = static_cast<float>(params[2]), min_p = static_cast<float>(params[3]);
    // the engine presets say which order each engine applies
    const rlpt::logprob_options o = params[4] != 0.0 ? rlpt::compat::vllm::sampled(temp, k, top_p, min_p)
                                                     : rlpt::compat::hf::sampled(temp, k, top_p, min_p);
    const auto t = f.get<index_t>(p + "targets");
    std::vector<float> logp(n), ent(n);
    std::vector<rlpt::mask_t> kept(static_cast<std::size_t>(n * v));
    rlpt::logprob_entropy(rlpt::view2d<const float>(x.data(), n, v), t,
                          {.logp = logp, .entropy = ent, .kept = rlpt::view2d<rlpt::mask_t>(kept.data(), n, v)}, o);
    INFO("case " << c << " T " << temp << " top_k " << k << " top_p " << top_p << " min_p " << min_p << " first "
                 << params[4]);
    CHECK(kept == f.get<rlpt::mask_t>(p + "kept"));
    const auto want_lp = f.get<double>(p + "logp"), want_ent = f.get<double>(p + "entropy");
    RLPT_CHECK_CLOSE(logp, want_lp, 1e-5, 2e-5);
    RLPT_CHECK_CLOSE(ent, want_ent, 1e-5, 2e-5);
  }
}

TEST_CASE("golden: the framework presets reproduce verl's and TRL's own numbers") {
  const lt::golden_file f(lt::golden_path("logprob", "from_logits.bin"));
  const auto n = static_cast<index_t>(f["logits"].shape[0]), v = static_cast<index_t>(f["logits"].shape[1]);
  const auto x = f.get<float>("logits");
  const auto t = f.get<index_t>("targets");
  const auto temp = static_cast<float>(f.get<double>("temperature")[0]);
  const rlpt::view2d<const float> xv(x.data(), n, v);
  for (const auto& [peer, opt] : {std::pair{std::string("verl"), rlpt::compat::verl::logprob(temp)},
                                  std::pair{std::string("trl"), rlpt::compat::trl::logprob(temp)}}) {
    std::vector<float> logp(n), ent(n);
    rlpt::logprob_entropy(xv, t, logp, ent, opt);
    const auto want = f.get<float>(peer + "_logp");
    INFO(peer);
    RLPT_CHECK_CLOSE(logp, want, 1e-5, 1e-4);
  }
  // the engine's distribution: rlpt::sampled is the same options as spelling them out
  const auto s = rlpt::sampled(0.6f, 200, 0.95f);
  CHECK(s.temperature == 0.6f);
  CHECK(s.top_k == 200);
  CHECK(s.top_p == 0.95f);
  CHECK(s.min_p == 0.0f);
  CHECK(rlpt::compat::vllm::sampled(1.0f).top_k == -1);
  CHECK(rlpt::compat::vllm::sampled(1.0f, -1, 1.0f, 0.1f).min_p_order == rlpt::min_p_order::first);
  CHECK(rlpt::compat::sglang::sampled(1.0f, -1, 1.0f, 0.1f).min_p_order == rlpt::min_p_order::last);
  CHECK(rlpt::compat::hf::sampled(1.0f, 0, 1.0f, 0.1f).min_p_order == rlpt::min_p_order::last);
}
