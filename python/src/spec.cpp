// SPDX-License-Identifier: Apache-2.0
#include "spec.hpp"

#include <rlpt/advantage/compat.hpp>
#include <rlpt/objective/compat.hpp>

#include <fmt/format.h>

#include <cstdlib>
#include <string>

namespace rlpt_py {

void raise(std::string_view id, const std::string& message) { throw rlpt::error(id, message); }

spec::spec(std::string_view text, std::string_view who) : who_(who) {
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t j = text.find(';', i);
    if (j == std::string_view::npos) j = text.size();
    const std::string_view item = text.substr(i, j - i);
    i = j + 1;
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0)
      raise(ids::bad_option, fmt::format("{}: option \"{}\" is not key=value", who_, item));
    std::string key(item.substr(0, eq));
    if (kv_.count(key)) raise(ids::bad_option, fmt::format("{}: option \"{}\" is given twice", who_, key));
    kv_.emplace(key, std::string(item.substr(eq + 1)));
    used_.emplace(std::move(key), false);
  }
}

bool spec::has(std::string_view key) const { return kv_.find(key) != kv_.end(); }

std::optional<std::string> spec::str(std::string_view key) {
  const auto it = kv_.find(key);
  if (it == kv_.end()) return std::nullopt;
  used_.find(key)->second = true;
  return it->second;
}

std::optional<double> spec::num(std::string_view key) {
  const auto s = str(key);
  if (!s) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s->c_str(), &end);
  if (s->empty() || end != s->c_str() + s->size())
    raise(ids::bad_option, fmt::format("{}: option {} = \"{}\" is not a number", who_, key, *s));
  return v;
}

std::optional<std::optional<double>> spec::num_or_none(std::string_view key) {
  const auto s = str(key);
  if (!s) return std::nullopt;
  if (*s == "none" || *s == "None") return std::optional<double>{};
  used_.find(key)->second = false;
  return std::optional<double>(*num(key));
}

std::optional<bool> spec::flag(std::string_view key) {
  const auto s = str(key);
  if (!s) return std::nullopt;
  if (*s == "1" || *s == "true" || *s == "True") return true;
  if (*s == "0" || *s == "false" || *s == "False") return false;
  raise(ids::bad_option, fmt::format("{}: option {} = \"{}\" is not a boolean", who_, key, *s));
}

void spec::finish() const {
  std::string unknown;
  for (const auto& [k, used] : used_)
    if (!used) unknown += (unknown.empty() ? "" : ", ") + k;
  if (!unknown.empty()) raise(ids::bad_option, fmt::format("{}: unknown option(s) {}", who_, unknown));
}

namespace {

template <class E>
E pick(spec& s, std::string_view key, E fallback, std::initializer_list<std::pair<std::string_view, E>> names) {
  const auto v = s.str(key);
  if (!v) return fallback;
  std::string known;
  for (const auto& [n, e] : names) {
    if (*v == n) return e;
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  raise(ids::bad_option, fmt::format("{}: {} = \"{}\" is not one of {}", s.who(), key, *v, known));
}

rlpt::nonfinite nonfinite_of(spec& s, std::string_view key, rlpt::nonfinite d) {
  return pick(s, key, d, {{"raise", rlpt::nonfinite::raise}, {"mask", rlpt::nonfinite::mask}});
}
rlpt::single single_of(spec& s, std::string_view key, rlpt::single d) {
  return pick(s, key, d, {{"raw", rlpt::single::raw}, {"zero", rlpt::single::zero}, {"raise", rlpt::single::raise}});
}
rlpt::scale scale_of(spec& s, std::string_view key, rlpt::scale d) {
  return pick(s, key, d,
              {{"group", rlpt::scale::group_std}, {"batch", rlpt::scale::batch_std}, {"none", rlpt::scale::none}});
}
rlpt::mask_mode mask_mode_of(spec& s, std::string_view key, rlpt::mask_mode d) {
  return pick(s, key, d,
              {{"skip", rlpt::mask_mode::skip}, {"zero", rlpt::mask_mode::zero}, {"reset", rlpt::mask_mode::reset}});
}

//! whiten=verl|openrlhf|openrlhf_centre|areal|none, then whiten.<field> overrides.
std::optional<rlpt::whiten_options> whiten_of(spec& s, std::optional<rlpt::whiten_options> d) {
  if (auto w = s.str("whiten")) {
    if (*w == "none" || *w == "0" || *w == "false")
      d.reset();
    else if (*w == "verl" || *w == "1" || *w == "true")
      d = rlpt::compat::verl::whiten();
    else if (*w == "openrlhf")
      d = rlpt::compat::openrlhf::whiten();
    else if (*w == "openrlhf_no_std_norm")
      d = rlpt::compat::openrlhf::whiten(true);
    else if (*w == "areal")
      d = rlpt::compat::areal::adv_norm();
    else
      raise(ids::bad_option, fmt::format("{}: whiten = \"{}\" is not one of none, verl, openrlhf, "
                                         "openrlhf_no_std_norm, areal",
                                         s.who(), *w));
  }
  if (d) {
    s.get("whiten.unbiased", d->unbiased);
    s.get("whiten.eps", d->eps);
    s.get("whiten.scale", d->scale);
    s.get("whiten.shift_mean", d->shift_mean);
    d->on_too_few = pick(s, "whiten.on_too_few", d->on_too_few,
                         {{"raise", rlpt::too_few::raise}, {"unit_std", rlpt::too_few::unit_std}});
    d->eps_at = pick(s, "whiten.eps_at", d->eps_at,
                     {{"add_var", rlpt::eps_mode::add_var},
                      {"floor_var", rlpt::eps_mode::floor_var},
                      {"add_std", rlpt::eps_mode::add_std}});
  }
  return d;
}

void read_agg(spec& s, const std::string& prefix, rlpt::aggregation& a) {
  a.mode = pick(s, prefix + "mode", a.mode,
                {{"token_mean", rlpt::agg_mode::token_mean},
                 {"token_sum", rlpt::agg_mode::token_sum},
                 {"seq_mean_token_sum", rlpt::agg_mode::seq_mean_token_sum},
                 {"seq_mean_token_mean", rlpt::agg_mode::seq_mean_token_mean},
                 {"seq_mean_token_sum_norm", rlpt::agg_mode::seq_mean_token_sum_norm}});
  s.get(prefix + "global_tokens", a.global_tokens);
  s.get(prefix + "global_seqs", a.global_seqs);
  s.get(prefix + "norm", a.norm);
  s.get(prefix + "factor", a.factor);
  s.get(prefix + "len_eps", a.len_eps);
  s.get(prefix + "count_empty_rows", a.count_empty_rows);
}

void read_optional_agg(spec& s, const std::string& name, const rlpt::aggregation& base,
                       std::optional<rlpt::aggregation>& out) {
  bool any = false;
  for (const char* f : {"mode", "global_tokens", "global_seqs", "norm", "factor", "len_eps", "count_empty_rows"})
    any = any || s.has(name + "." + f);
  if (!any) return;
  rlpt::aggregation a = out.value_or(base);
  read_agg(s, name + ".", a);
  out = a;
}

rlpt::objective custom_objective(spec& s) {
  rlpt::objective o;
  const std::string p = s.str("policy").value_or("ppo_clip");
  if (p == "ppo_clip") {
    rlpt::ppo_clip t;
    s.get("policy.eps_low", t.eps_low);
    s.get("policy.eps_high", t.eps_high);
    s.get("policy.dual_clip", t.dual_clip);
    s.get("policy.delta", t.delta);
    s.get("policy.log_ratio_clamp", t.log_ratio_clamp);
    o.policy = t;
  } else if (p == "gspo") {
    rlpt::gspo t;
    s.get("policy.eps_low", t.eps_low);
    s.get("policy.eps_high", t.eps_high);
    s.get("policy.token_level", t.token_level);
    s.get("policy.log_ratio_max", t.log_ratio_max);
    s.get("policy.dual_clip", t.dual_clip);
    s.get("policy.delta", t.delta);
    s.get("policy.mean_advantage", t.mean_advantage);
    s.get("policy.length_normalized", t.length_normalized);
    o.policy = t;
  } else if (p == "gmpo") {
    rlpt::gmpo t;
    s.get("policy.eps_low", t.eps_low);
    s.get("policy.eps_high", t.eps_high);
    s.get("policy.log_ratio_clamp", t.log_ratio_clamp);
    o.policy = t;
  } else if (p == "cispo") {
    rlpt::cispo t;
    s.get("policy.eps_low", t.eps_low);
    s.get("policy.eps_high", t.eps_high);
    t.bounds = pick(s, "policy.bounds", t.bounds,
                    {{"relative", rlpt::cispo_bounds::relative}, {"absolute", rlpt::cispo_bounds::absolute}});
    s.get("policy.cap", t.cap);
    s.get("policy.log_ratio_clamp", t.log_ratio_clamp);
    o.policy = t;
  } else if (p == "sapo") {
    rlpt::sapo t;
    s.get("policy.tau_pos", t.tau_pos);
    s.get("policy.tau_neg", t.tau_neg);
    s.get("policy.log_ratio_clamp", t.log_ratio_clamp);
    s.get("policy.token_level", t.token_level);
    s.get("policy.mean_advantage", t.mean_advantage);
    o.policy = t;
  } else if (p == "dppo") {
    rlpt::dppo t;
    t.divergence = pick(s, "policy.divergence", t.divergence,
                        {{"tv", rlpt::dppo_divergence::tv}, {"binary_kl", rlpt::dppo_divergence::binary_kl}});
    s.get("policy.eps_low", t.eps_low);
    s.get("policy.eps_high", t.eps_high);
    s.get("policy.trunc", t.trunc);
    s.get("policy.log_ratio_clamp", t.log_ratio_clamp);
    o.policy = t;
  } else if (p == "dro") {
    rlpt::dro t;
    s.get("policy.beta", t.beta);
    o.policy = t;
  } else if (p == "vespo") {
    rlpt::vespo t;
    s.get("policy.k_pos", t.k_pos);
    s.get("policy.lambda_pos", t.lambda_pos);
    s.get("policy.k_neg", t.k_neg);
    s.get("policy.lambda_neg", t.lambda_neg);
    o.policy = t;
  } else if (p == "policy_gradient") {
    o.policy = rlpt::policy_gradient{};
  } else if (p == "none") {
    o.policy = rlpt::no_policy{};
  } else {
    raise(ids::bad_option, fmt::format("{}: policy = \"{}\" is not one of ppo_clip, gspo, gmpo, cispo, sapo, "
                                       "dppo, dro, vespo, policy_gradient, none",
                                       s.who(), p));
  }
  auto& c = o.correction;
  c.weight.level = pick(s, "correction.weight.level", c.weight.level,
                        {{"none", rlpt::is_level::none},
                         {"token", rlpt::is_level::token},
                         {"seq_product", rlpt::is_level::seq_product},
                         {"seq_geomean", rlpt::is_level::seq_geomean}});
  c.weight.bound =
      pick(s, "correction.weight.bound", c.weight.bound,
           {{"none", rlpt::is_bound::none}, {"truncate", rlpt::is_bound::truncate}, {"mask", rlpt::is_bound::mask}});
  s.get("correction.weight.lo", c.weight.lo);
  s.get("correction.weight.hi", c.weight.hi);
  s.get("correction.weight.batch_normalize", c.weight.batch_normalize);
  s.get("correction.weight.batch_mean", c.weight.batch_mean);
  auto rejection = [&](const std::string& key, rlpt::rejection& r) {
    r.stat = pick(s, key + ".stat", r.stat,
                  {{"none", rlpt::rs_stat::none},
                   {"ratio", rlpt::rs_stat::ratio},
                   {"k1", rlpt::rs_stat::k1},
                   {"k2", rlpt::rs_stat::k2},
                   {"k3", rlpt::rs_stat::k3},
                   {"binary_kl", rlpt::rs_stat::binary_kl},
                   {"tv", rlpt::rs_stat::tv},
                   {"log_ratio", rlpt::rs_stat::log_ratio},
                   {"k3_inverse", rlpt::rs_stat::k3_inverse}});
    r.level = pick(s, key + ".level", r.level,
                   {{"token", rlpt::rs_level::token},
                    {"seq_sum", rlpt::rs_level::seq_sum},
                    {"seq_mean", rlpt::rs_level::seq_mean},
                    {"seq_max", rlpt::rs_level::seq_max}});
    s.get(key + ".lo", r.lo);
    s.get(key + ".hi", r.hi);
  };
  rejection("correction.reject", c.reject);
  for (std::size_t i = 0; i < c.reject_also.size(); ++i)
    rejection(fmt::format("correction.reject_also.{}", i), c.reject_also[i]);
  c.numerator = pick(s, "correction.numerator", c.numerator,
                     {{"proximal", rlpt::ratio_numerator::proximal}, {"current", rlpt::ratio_numerator::current}});
  c.rejected = pick(s, "correction.rejected", c.rejected,
                    {{"removed", rlpt::rejected_tokens::removed},
                     {"zero_weight", rlpt::rejected_tokens::zero_weight},
                     {"masked", rlpt::rejected_tokens::masked}});
  c.action = pick(s, "correction.action", c.action,
                  {{"reject", rlpt::rejection_action::reject}, {"bound_weight", rlpt::rejection_action::bound_weight}});
  s.get("correction.log_ratio_clamp", c.log_ratio_clamp);
  // Framework KL and aggregation conventions as a starting point, then field overrides.
  if (auto t = s.str("kl.verl")) o.kl = rlpt::compat::verl::kl(*t, 1.0);
  if (auto t = s.str("kl.openrlhf")) {
    bool unbiased = false;
    s.get("kl.openrlhf_unbiased", unbiased);
    o.kl = rlpt::compat::openrlhf::kl(*t, 1.0, unbiased);
  }
  if (auto m = s.str("agg.verl")) {
    int dp = 1;
    std::optional<double> tokens, seqs, factor;
    s.get("agg.dp_size", dp);
    s.get("agg.batch_num_tokens", tokens);
    s.get("agg.global_batch_size", seqs);
    s.get("agg.loss_scale_factor", factor);
    o.agg = rlpt::compat::verl::agg(*m, dp, tokens, seqs, factor);
  }
  if (auto tl = s.flag("agg.openrlhf_token_level")) {
    int dp = 1;
    std::optional<double> tokens, seqs;
    s.get("agg.dp_size", dp);
    s.get("agg.batch_num_tokens", tokens);
    s.get("agg.global_batch_size", seqs);
    o.agg = rlpt::compat::openrlhf::agg(*tl, dp, tokens, seqs);
  }
  auto& k = o.kl;
  s.get("kl.coef", k.coef);
  k.estimator = pick(s, "kl.estimator", k.estimator,
                     {{"k1", rlpt::kl_estimator::k1},
                      {"abs", rlpt::kl_estimator::abs},
                      {"k2", rlpt::kl_estimator::k2},
                      {"k3", rlpt::kl_estimator::k3}});
  s.get("kl.k3_x_min", k.k3_x_min);
  s.get("kl.k3_x_max", k.k3_x_max);
  s.get("kl.output_clamp", k.output_clamp);
  k.gradient = pick(s, "kl.gradient", k.gradient,
                    {{"natural", rlpt::kl_gradient::natural},
                     {"straight_through", rlpt::kl_gradient::straight_through},
                     {"k2_importance", rlpt::kl_gradient::k2_importance}});
  s.get("kl.is_cap", k.is_cap);
  s.get("kl.importance_corrected", k.importance_corrected);
  s.get("kl.importance_per_sequence", k.importance_per_sequence);
  s.get("entropy.coef", o.entropy.coef);
  s.get("value.coef", o.value.coef);
  s.get("value.clip", o.value.clip);
  s.get("value.half", o.value.half);
  s.get("value.huber_delta", o.value.huber_delta);
  read_agg(s, "agg.", o.agg);
  return o;
}

} // namespace

rlpt::objective objective_from_spec(std::string_view text, std::string* description) {
  spec s(text, "rlpt objective");
  const std::string preset = s.str("preset").value_or("custom");
  rlpt::objective o;
  if (preset == "verl_actor") {
    rlpt::compat::verl::actor_config c;
    std::string loss_mode = "vanilla", agg = "token-mean", kl_type = "low_var_kl";
    s.get("loss_mode", loss_mode);
    s.get("clip_ratio", c.clip_ratio);
    s.get("clip_ratio_low", c.clip_ratio_low);
    s.get("clip_ratio_high", c.clip_ratio_high);
    s.get("clip_ratio_c", c.clip_ratio_c);
    s.get("tau_pos", c.tau_pos);
    s.get("tau_neg", c.tau_neg);
    s.get("dro_beta", c.dro_beta);
    s.get("loss_agg_mode", agg);
    s.get("use_kl_loss", c.use_kl_loss);
    s.get("kl_loss_coef", c.kl_loss_coef);
    s.get("kl_loss_type", kl_type);
    s.get("entropy_coeff", c.entropy_coeff);
    s.get("dp_size", c.dp_size);
    s.get("batch_num_tokens", c.batch_num_tokens);
    s.get("global_batch_size", c.global_batch_size);
    s.get("loss_scale_factor", c.loss_scale_factor);
    c.loss_mode = loss_mode;
    c.loss_agg_mode = agg;
    c.kl_loss_type = kl_type;
    std::string rollout_is, is_threshold = "2.0", rollout_rs, rs_threshold;
    bool bypass = false, batch_normalize = false;
    double batch_mean = -1.0;
    s.get("rollout_is", rollout_is);
    s.get("rollout_is_threshold", is_threshold);
    s.get("rollout_is_batch_normalize", batch_normalize);
    s.get("rollout_is_batch_mean", batch_mean); // the step's mean (rlpt), when a call is one micro-batch
    s.get("rollout_rs", rollout_rs);
    s.get("rollout_rs_threshold", rs_threshold);
    s.get("bypass_mode", bypass);
    rlpt::off_policy_correction corr = rlpt::compat::verl::rollout_correction(rollout_is, is_threshold, rollout_rs,
                                                                              rs_threshold, bypass, batch_normalize);
    corr.weight.batch_mean = batch_mean;
    o = rlpt::compat::verl::actor(c, corr);
    if (description) *description = fmt::format("verl actor (loss_mode {}, loss_agg_mode {})", loss_mode, agg);
  } else if (preset == "verl_critic") {
    double clip = 0.5;
    std::string agg = "token-mean";
    int dp = 1;
    std::optional<double> tokens, seqs;
    s.get("cliprange_value", clip);
    s.get("loss_agg_mode", agg);
    s.get("dp_size", dp);
    s.get("batch_num_tokens", tokens);
    s.get("global_batch_size", seqs);
    o = rlpt::compat::verl::critic(clip, agg, dp, tokens, seqs);
    if (description) *description = fmt::format("verl critic (loss_agg_mode {})", agg);
  } else if (preset == "trl_grpo") {
    rlpt::compat::trl::grpo_config c;
    std::string loss_type = "dapo", level = "token", vmode = "sequence_mask";
    s.get("loss_type", loss_type);
    s.get("epsilon", c.epsilon);
    s.get("epsilon_high", c.epsilon_high);
    s.get("delta", c.delta);
    s.get("importance_sampling_level", level);
    s.get("beta", c.beta);
    s.get("use_bias_correction_kl", c.use_bias_correction_kl);
    s.get("sapo_temperature_pos", c.sapo_temperature_pos);
    s.get("sapo_temperature_neg", c.sapo_temperature_neg);
    s.get("vespo_k_pos", c.vespo_k_pos);
    s.get("vespo_lambda_pos", c.vespo_lambda_pos);
    s.get("vespo_k_neg", c.vespo_k_neg);
    s.get("vespo_lambda_neg", c.vespo_lambda_neg);
    s.get("entropy_coef", c.entropy_coef);
    s.get("max_completion_length", c.max_completion_length);
    s.get("gradient_accumulation_steps", c.gradient_accumulation_steps);
    s.get("num_processes", c.num_processes);
    s.get("steps_per_generation", c.steps_per_generation);
    s.get("num_items_in_batch", c.num_items_in_batch);
    s.get("vllm_importance_sampling_correction", c.vllm_importance_sampling_correction);
    s.get("vllm_importance_sampling_mode", vmode);
    s.get("vllm_importance_sampling_min", c.vllm_importance_sampling_min);
    s.get("vllm_importance_sampling_max", c.vllm_importance_sampling_max);
    c.loss_type = loss_type;
    c.importance_sampling_level = level;
    c.vllm_importance_sampling_mode = vmode;
    o = rlpt::compat::trl::grpo(c);
    if (description) *description = fmt::format("TRL GRPO (loss_type {})", loss_type);
  } else if (preset == "trl_rloo") {
    rlpt::compat::trl::rloo_config c;
    s.get("epsilon", c.epsilon);
    s.get("epsilon_high", c.epsilon_high);
    o = rlpt::compat::trl::rloo(c);
    if (description) *description = "TRL RLOO";
  } else if (preset == "openrlhf_policy") {
    rlpt::compat::openrlhf::policy_loss_config c;
    std::string type = "ppo", level = "off", mode = "mask", gating = "ratio", kl_est = "k1";
    s.get("clip_eps_low", c.clip_eps_low);
    s.get("clip_eps_high", c.clip_eps_high);
    s.get("dual_clip", c.dual_clip);
    s.get("token_level_loss", c.token_level_loss);
    s.get("policy_loss_type", type);
    s.get("is_correction_level", level);
    s.get("is_correction_mode", mode);
    s.get("is_correction_gating", gating);
    s.get("is_correction_low", c.is_correction_low);
    s.get("is_correction_high", c.is_correction_high);
    s.get("dp_size", c.dp_size);
    s.get("batch_num_tokens", c.batch_num_tokens);
    s.get("global_batch_size", c.global_batch_size);
    s.get("kl_coef", c.kl_coef);
    s.get("kl_estimator", kl_est);
    s.get("kl_unbiased_gradient", c.kl_unbiased_gradient);
    s.get("entropy_coef", c.entropy_coef);
    c.policy_loss_type = type;
    c.is_correction_level = level;
    c.is_correction_mode = mode;
    c.is_correction_gating = gating;
    c.kl_estimator = kl_est;
    o = rlpt::compat::openrlhf::policy_loss(c);
    if (description) *description = fmt::format("OpenRLHF PolicyLoss ({})", type);
  } else if (preset == "openrlhf_value") {
    std::optional<double> clip, tokens, seqs; // clip_eps: ValueLoss's default None
    bool token_level = true;
    int dp = 1;
    s.get("clip_eps", clip);
    s.get("token_level_loss", token_level);
    s.get("dp_size", dp);
    s.get("batch_num_tokens", tokens);
    s.get("global_batch_size", seqs);
    o = rlpt::compat::openrlhf::value(clip, token_level, dp, tokens, seqs);
    if (description) *description = "OpenRLHF ValueLoss";
  } else if (preset == "areal_actor") {
    // PPOActorConfig's fields; rejection_sampling.* are RejectionSamplingConfig's
    // (rejection_sampling = false: None).
    rlpt::compat::areal::actor_config c;
    s.get("eps_clip", c.eps_clip);
    s.get("eps_clip_higher", c.eps_clip_higher);
    s.get("c_clip", c.c_clip);
    s.get("use_decoupled_loss", c.use_decoupled_loss);
    s.get("rejection_sampling", c.rejection_sampling);
    s.get("rejection_sampling.level", c.rejection_level);
    s.get("rejection_sampling.action", c.rejection_action);
    s.get("rejection_sampling.metric", c.rejection_metric);
    s.get("rejection_sampling.agg", c.rejection_agg);
    s.get("rejection_sampling.upper", c.rejection_upper);
    s.get("rejection_sampling.lower", c.rejection_lower);
    s.get("importance_sampling_level", c.importance_sampling_level);
    s.get("use_sapo_loss", c.use_sapo_loss);
    s.get("sapo_tau_pos", c.sapo_tau_pos);
    s.get("sapo_tau_neg", c.sapo_tau_neg);
    o = rlpt::compat::areal::actor(c);
    if (description)
      *description = c.use_sapo_loss ? "AReaL sapo_loss_fn"
                                     : fmt::format("AReaL ppo_actor_loss_fn ({} level)", c.importance_sampling_level);
  } else if (preset == "custom") {
    o = custom_objective(s);
    if (description) *description = "custom objective";
  } else {
    raise(ids::bad_option, fmt::format("rlpt objective: preset = \"{}\" is not one of verl_actor, verl_critic, "
                                       "trl_grpo, trl_rloo, openrlhf_policy, openrlhf_value, areal_actor, custom",
                                       preset));
  }
  // Aggregation overrides of the non-default terms (any preset), then the common keys.
  read_optional_agg(s, "policy_agg", o.agg, o.policy_agg);
  read_optional_agg(s, "kl_agg", o.agg, o.kl_agg);
  read_optional_agg(s, "entropy_agg", o.agg, o.entropy_agg);
  read_optional_agg(s, "value_agg", o.agg, o.value_agg);
  o.nonfinite = nonfinite_of(s, "nonfinite", o.nonfinite);
  std::optional<double> tokens, seqs;
  s.get("global_tokens", tokens);
  s.get("global_seqs", seqs);
  if (tokens || seqs) {
    auto set = [&](rlpt::aggregation& a) {
      if (tokens) a.global_tokens = *tokens;
      if (seqs) a.global_seqs = *seqs;
    };
    set(o.agg);
    for (auto* a : {&o.policy_agg, &o.kl_agg, &o.entropy_agg, &o.value_agg})
      if (*a) set(**a);
  }
  s.finish();
  return o;
}

outcome_options outcome_from_spec(std::string_view text) {
  spec s(text, "rlpt advantages");
  outcome_options o;
  o.estimator = s.str("estimator").value_or("grpo");
  const std::string preset = s.str("preset").value_or("rlpt");
  auto bad_preset = [&](std::string_view known) {
    raise(ids::bad_option,
          fmt::format("rlpt advantages: {} has no preset \"{}\" (known: {})", o.estimator, preset, known));
  };
  if (o.estimator == "grpo") {
    if (preset == "rlpt")
      o.grpo = {};
    else if (preset == "verl")
      o.grpo = rlpt::compat::verl::grpo();
    else if (preset == "trl")
      o.grpo = rlpt::compat::trl::grpo();
    else if (preset == "openrlhf")
      o.grpo = rlpt::compat::openrlhf::group_norm();
    else if (preset == "openrlhf_dr_grpo")
      o.grpo = rlpt::compat::openrlhf::dr_grpo();
    else if (preset == "areal")
      o.grpo = rlpt::compat::areal::reward_norm();
    else if (preset == "slime")
      o.grpo = rlpt::compat::slime::grpo();
    else
      bad_preset("rlpt, verl, trl, openrlhf, openrlhf_dr_grpo, areal, slime");
    auto& g = o.grpo;
    g.scale = scale_of(s, "scale", g.scale);
    s.get("unbiased", g.unbiased);
    s.get("epsilon", g.epsilon);
    s.get("std_floor", g.std_floor);
    g.single = single_of(s, "single", g.single);
    g.on_nonfinite = nonfinite_of(s, "on_nonfinite", g.on_nonfinite);
  } else if (o.estimator == "rloo") {
    if (preset == "rlpt")
      o.rloo = {};
    else if (preset == "verl")
      o.rloo = rlpt::compat::verl::rloo();
    else if (preset == "verl_vectorized")
      o.rloo = rlpt::compat::verl::rloo_vectorized();
    else if (preset == "trl")
      o.rloo = rlpt::compat::trl::rloo();
    else if (preset == "openrlhf")
      o.rloo = rlpt::compat::openrlhf::rloo();
    else
      bad_preset("rlpt, verl, verl_vectorized, trl, openrlhf");
    auto& r = o.rloo;
    r.single = single_of(s, "single", r.single);
    r.on_nonfinite = nonfinite_of(s, "on_nonfinite", r.on_nonfinite);
    s.get("batch_normalize", r.batch_normalize);
    s.get("batch_epsilon", r.batch_epsilon);
  } else if (o.estimator == "opo") {
    if (preset == "verl")
      o.opo = rlpt::compat::verl::opo();
    else if (preset != "rlpt")
      bad_preset("rlpt, verl");
    o.opo.single = single_of(s, "single", o.opo.single);
    o.opo.on_nonfinite = nonfinite_of(s, "on_nonfinite", o.opo.on_nonfinite);
  } else if (o.estimator == "gpg") {
    if (preset == "verl")
      o.gpg = rlpt::compat::verl::gpg();
    else if (preset != "rlpt")
      bad_preset("rlpt, verl");
    s.get("f_norm", o.gpg.f_norm);
    o.gpg.single = single_of(s, "single", o.gpg.single);
    o.gpg.on_nonfinite = nonfinite_of(s, "on_nonfinite", o.gpg.on_nonfinite);
  } else if (o.estimator == "passk") {
    if (preset == "verl")
      o.passk = rlpt::compat::verl::grpo_passk();
    else if (preset != "rlpt")
      bad_preset("rlpt, verl");
    s.get("scale_by_std", o.passk.scale_by_std);
    s.get("epsilon", o.passk.epsilon);
    o.passk.single = single_of(s, "single", o.passk.single);
    o.passk.on_nonfinite = nonfinite_of(s, "on_nonfinite", o.passk.on_nonfinite);
  } else {
    raise(ids::bad_option,
          fmt::format("rlpt advantages: estimator = \"{}\" is not one of grpo, rloo, opo, gpg, passk", o.estimator));
  }
  s.finish();
  return o;
}

rlpt::gae_options gae_from_spec(std::string_view text) {
  spec s(text, "rlpt gae");
  double gamma = 1.0, lam = 1.0;
  s.get("gamma", gamma);
  s.get("lam", lam);
  const std::string preset = s.str("preset").value_or("rlpt");
  rlpt::gae_options o;
  if (preset == "verl")
    o = rlpt::compat::verl::gae(gamma, lam);
  else if (preset == "openrlhf")
    o = rlpt::compat::openrlhf::gae(gamma, lam);
  else if (preset == "slime")
    o = rlpt::compat::slime::gae(gamma, lam);
  else if (preset == "areal")
    o = rlpt::compat::areal::gae(gamma, lam);
  else if (preset == "rlpt")
    o = {.gamma = gamma, .lambda = lam};
  else
    raise(ids::bad_option,
          fmt::format("rlpt gae: preset \"{}\" is not one of rlpt, verl, openrlhf, slime, areal", preset));
  o.masked = mask_mode_of(s, "masked", o.masked);
  o.whiten = whiten_of(s, o.whiten);
  o.on_nonfinite = nonfinite_of(s, "on_nonfinite", o.on_nonfinite);
  s.finish();
  return o;
}

rlpt::reinforce_pp_options reinforce_pp_from_spec(std::string_view text) {
  spec s(text, "rlpt reinforce_pp");
  double gamma = 1.0;
  s.get("gamma", gamma);
  const std::string preset = s.str("preset").value_or("rlpt");
  rlpt::reinforce_pp_options o;
  if (preset == "verl")
    o = rlpt::compat::verl::reinforce_pp(gamma);
  else if (preset == "openrlhf")
    o = rlpt::compat::openrlhf::reinforce(gamma);
  else if (preset == "rlpt")
    o.gamma = gamma;
  else
    raise(ids::bad_option, fmt::format("rlpt reinforce_pp: preset \"{}\" is not one of rlpt, verl, openrlhf", preset));
  o.masked = mask_mode_of(s, "masked", o.masked);
  o.whiten = whiten_of(s, o.whiten);
  o.on_nonfinite = nonfinite_of(s, "on_nonfinite", o.on_nonfinite);
  s.finish();
  return o;
}

rlpt::reinforce_baseline_options reinforce_baseline_from_spec(std::string_view text) {
  spec s(text, "rlpt reinforce_pp_baseline");
  const std::string preset = s.str("preset").value_or("rlpt");
  rlpt::reinforce_baseline_options o;
  if (preset == "verl")
    o = rlpt::compat::verl::reinforce_pp_baseline();
  else if (preset == "openrlhf")
    o = rlpt::compat::openrlhf::reinforce_baseline();
  else if (preset != "rlpt")
    raise(ids::bad_option,
          fmt::format("rlpt reinforce_pp_baseline: preset \"{}\" is not one of rlpt, verl, openrlhf", preset));
  o.single = single_of(s, "single", o.single);
  o.whiten = whiten_of(s, o.whiten);
  o.on_nonfinite = nonfinite_of(s, "on_nonfinite", o.on_nonfinite);
  s.finish();
  return o;
}

rlpt::remax_options remax_from_spec(std::string_view text) {
  spec s(text, "rlpt remax");
  const std::string preset = s.str("preset").value_or("rlpt");
  rlpt::remax_options o;
  if (preset == "verl")
    o = rlpt::compat::verl::remax();
  else if (preset != "rlpt")
    raise(ids::bad_option, fmt::format("rlpt remax: preset \"{}\" is not one of rlpt, verl", preset));
  o.on_nonfinite = nonfinite_of(s, "on_nonfinite", o.on_nonfinite);
  s.finish();
  return o;
}

} // namespace rlpt_py
