// SPDX-License-Identifier: Apache-2.0
// One GRPO training step's rlpt part computed by the C++ library alone (no torch), for
// test_grpo_steps.py to compare with the rlpt_torch extension bit for bit:
//   GRPO advantages (verl preset) -> logprob/entropy of the completion tokens from the logits ->
//   verl actor objective (vanilla PPO clip, low_var_kl, entropy bonus) -> d loss / d logits.
//
// Usage: rlpt_torch_reference_runner <dir>. <dir> holds dims.txt ("B T V"), config.txt
// ("key value" lines) and raw little-endian arrays: rewards.f32 [B], group_ids.i64 [B],
// logits.f64 [B, T, V], tokens.i64 [B, T], mask.u8 [B, T], old_logp.f64 [B, T],
// ref_logp.f64 [B, T]. Writes out_adv.f32, out_logp.f32, out_entropy.f32, out_loss.f64 and
// out_grad_logits.f64 next to them.
#include <rlpt/advantage.hpp>
#include <rlpt/logprob.hpp>
#include <rlpt/objective.hpp>

#include <cstdint>
#include <cstdio>
#include <exception>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace {

using rlpt::index_t;

template <class T>
std::vector<T> read_array(const std::string& path, index_t n) {
  std::ifstream f(path, std::ios::binary);
  RLPT_CHECK(f.good(), "rlpt.example.io", "cannot open {}", path);
  std::vector<T> v(static_cast<std::size_t>(n));
  f.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  RLPT_CHECK(f.gcount() == static_cast<std::streamsize>(v.size() * sizeof(T)) && f.peek() == EOF, "rlpt.example.io",
             "{} does not hold exactly {} elements of {} bytes", path, n, sizeof(T));
  return v;
}

template <class T>
void write_array(const std::string& path, const std::vector<T>& v) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
  RLPT_CHECK(f.good(), "rlpt.example.io", "cannot write {}", path);
}

std::map<std::string, std::string> read_config(const std::string& path) {
  std::ifstream f(path);
  RLPT_CHECK(f.good(), "rlpt.example.io", "cannot open {}", path);
  std::map<std::string, std::string> kv;
  std::string k, v;
  while (f >> k >> v) kv[k] = v;
  return kv;
}

int run(const std::string& dir) {
  index_t B = 0, T = 0, V = 0;
  {
    std::ifstream f(dir + "/dims.txt");
    f >> B >> T >> V;
    RLPT_CHECK(f.good() && B > 0 && T > 1 && V > 0, "rlpt.example.io", "{}/dims.txt must hold B T V", dir);
  }
  const auto cfg = read_config(dir + "/config.txt");
  auto num = [&](const char* key) {
    RLPT_CHECK(cfg.count(key) == 1, "rlpt.example.io", "config.txt lacks {}", key);
    return std::stod(cfg.at(key));
  };
  auto str = [&](const char* key) {
    RLPT_CHECK(cfg.count(key) == 1, "rlpt.example.io", "config.txt lacks {}", key);
    return cfg.at(key);
  };
  const index_t N = B * T;
  const auto rewards = read_array<float>(dir + "/rewards.f32", B);
  const auto ids = read_array<std::int64_t>(dir + "/group_ids.i64", B);
  const auto logits = read_array<double>(dir + "/logits.f64", N * V);
  const auto tokens = read_array<index_t>(dir + "/tokens.i64", N);
  const auto mask = read_array<rlpt::mask_t>(dir + "/mask.u8", N);
  const auto old_logp = read_array<double>(dir + "/old_logp.f64", N);
  const auto ref_logp = read_array<double>(dir + "/ref_logp.f64", N);

  // 1. advantages: verl compute_grpo_outcome_advantage
  std::vector<float> adv(static_cast<std::size_t>(B));
  const rlpt::groups g = rlpt::groups::from_ids(ids);
  (void)rlpt::grpo_advantages(rewards, g, adv, rlpt::compat::verl::grpo());

  // 2. logprob and entropy of every token from the previous position's logits
  const rlpt::token_layout layout = rlpt::token_layout::padded(B, T);
  const rlpt::logprob_options lo{.temperature = static_cast<float>(num("temperature")),
                                 .on_dropped = rlpt::dropped_target::neg_inf};
  const rlpt::view2d<const double> x(logits.data(), N, V, V);
  std::vector<float> logp(static_cast<std::size_t>(N)), entropy(static_cast<std::size_t>(N)),
      lse(static_cast<std::size_t>(N));
  (void)rlpt::sequence_logprob_entropy(x, tokens, layout, {},
                                       rlpt::logprob_outputs{.logp = logp, .entropy = entropy, .saved = {.lse = lse}},
                                       lo);

  // 3. the verl actor objective in float64 (what the Python side does after .double())
  rlpt::compat::verl::actor_config ac;
  ac.loss_mode = "vanilla";
  ac.clip_ratio_low = num("clip_ratio_low");
  ac.clip_ratio_high = num("clip_ratio_high");
  const std::string agg_mode = str("loss_agg_mode"), kl_type = str("kl_loss_type");
  ac.loss_agg_mode = agg_mode;
  ac.use_kl_loss = true;
  ac.kl_loss_coef = num("kl_loss_coef");
  ac.kl_loss_type = kl_type;
  ac.entropy_coeff = num("entropy_coeff");
  const rlpt::objective obj = rlpt::compat::verl::actor(ac);
  const std::vector<double> logp_d(logp.begin(), logp.end()), ent_d(entropy.begin(), entropy.end()),
      adv_d(adv.begin(), adv.end());
  std::vector<double> g_logp(static_cast<std::size_t>(N)), g_ent(static_cast<std::size_t>(N));
  const rlpt::basic_objective_inputs<double> in{.layout = layout,
                                                .mask = mask,
                                                .logp = logp_d,
                                                .old_logp = old_logp,
                                                .ref_logp = ref_logp,
                                                .seq_adv = adv_d,
                                                .entropy = ent_d};
  const rlpt::objective_result r = rlpt::evaluate(obj, in, rlpt::basic_objective_grads<double>{g_logp, g_ent});

  // 4. back through the float32 logprob outputs (torch rounds the float64 gradient to float32)
  std::vector<float> dlogp(g_logp.begin(), g_logp.end()), dent(g_ent.begin(), g_ent.end());
  std::vector<double> dlogits(static_cast<std::size_t>(N * V));
  rlpt::sequence_logprob_entropy_backward(x, tokens, layout, {}, dlogp, dent, entropy,
                                          rlpt::logprob_saved_view{.lse = lse},
                                          rlpt::view2d<double>(dlogits.data(), N, V, V), lo);

  write_array(dir + "/out_adv.f32", adv);
  write_array(dir + "/out_logp.f32", logp);
  write_array(dir + "/out_entropy.f32", entropy);
  write_array(dir + "/out_loss.f64", std::vector<double>{r.loss});
  write_array(dir + "/out_grad_logits.f64", dlogits);
  std::printf("loss %.17g policy %.17g kl %.17g entropy %.17g\n", r.loss, r.policy_loss, r.kl_loss, r.entropy_loss);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <step dir>\n", argv[0]);
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
