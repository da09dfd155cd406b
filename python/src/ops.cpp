// SPDX-License-Identifier: Apache-2.0
// The rlpt operator library (torch.ops.rlpt.*): schemas, and the CPU kernels of the objective
// and the advantage estimators. Fake (meta) kernels and autograd formulas are registered from
// Python (rlpt/_ops.py) with torch.library.register_fake / register_autograd.
#include "objective_call.hpp"

#include <torch/library.h>

#include <rlpt/advantage.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/objective.hpp>

#include <fmt/format.h>

#include <array>
#include <cstring>

namespace rlpt_py {

namespace {
at::ScalarType float_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }
} // namespace

objective_call prepare_objective(c10::string_view spec, const opt_tensor& logp, const opt_tensor& mask,
                                 const opt_tensor& old_logp, const opt_tensor& behav_logp, const opt_tensor& ref_logp,
                                 const opt_tensor& adv, const opt_tensor& seq_adv, const opt_tensor& entropy,
                                 const opt_tensor& values, const opt_tensor& old_values, const opt_tensor& returns,
                                 const opt_tensor& cu_seqlens, bool grad_logp, bool grad_entropy, bool grad_values,
                                 const opt_tensor& seq_in_denominator) {
  objective_call c;
  c.obj = objective_from_spec(std::string_view(spec.data(), spec.size()));
  const opt_tensor& ref = logp ? logp : values;
  if (!ref) raise(ids::shape, "rlpt objective: pass logp (policy terms) or values (value terms)");
  const std::string_view ref_name = logp ? "logp" : "values";
  if (!at::isFloatingType(ref->scalar_type()))
    raise(ids::dtype, fmt::format("{} has dtype {}; the objective takes floating-point log-probs and values", ref_name,
                                  dtype_name(ref->scalar_type())));
  c.compute = float_type(ref->scalar_type());
  const auto T = c.compute;
  std::optional<at::Tensor> mask_b;
  if (mask) mask_b = mask_bytes(*mask, "mask");
  const at::ScalarType mask_want = mask ? mask_b->scalar_type() : at::kByte;
  c.b = describe(*ref, ref_name, cu_seqlens,
                 {{&logp, T, "logp"},
                  {&mask_b, mask_want, "mask"},
                  {&old_logp, T, "old_logp"},
                  {&behav_logp, T, "behav_logp"},
                  {&ref_logp, T, "ref_logp"},
                  {&adv, T, "adv"},
                  {&entropy, T, "entropy"},
                  {&values, T, "values"},
                  {&old_values, T, "old_values"},
                  {&returns, T, "returns"}});
  auto in = [&](const opt_tensor& t, std::string_view what) -> opt_tensor {
    if (!t) return std::nullopt;
    if (!at::isFloatingType(t->scalar_type()))
      raise(ids::dtype, fmt::format("{} has dtype {}; per-token inputs of the objective are floating point", what,
                                    dtype_name(t->scalar_type())));
    return token_input(*t, T, c.b, what);
  };
  if (mask_b) c.mask = token_input(*mask_b, at::kByte, c.b, "mask");
  c.logp = in(logp, "logp");
  c.old_logp = in(old_logp, "old_logp");
  c.behav_logp = in(behav_logp, "behav_logp");
  c.ref_logp = in(ref_logp, "ref_logp");
  c.adv = in(adv, "adv");
  c.entropy = in(entropy, "entropy");
  c.values = in(values, "values");
  c.old_values = in(old_values, "old_values");
  c.returns = in(returns, "returns");
  if (seq_adv) {
    expect_device(*seq_adv, c.b.device, "seq_adv");
    if (seq_adv->dim() != 1)
      raise(ids::shape,
            fmt::format("seq_adv has shape {}; it is one advantage per sequence [B]", dims(seq_adv->sizes())));
    c.seq_adv = contiguous_as(*seq_adv, T, "seq_adv");
  }
  if (seq_in_denominator) { // its length is rlpt's check (one per sequence)
    expect_device(*seq_in_denominator, c.b.device, "seq_in_denominator");
    if (seq_in_denominator->dim() != 1)
      raise(ids::shape, fmt::format("seq_in_denominator has shape {}; it is one flag per sequence [B]",
                                    dims(seq_in_denominator->sizes())));
    c.in_den = mask_bytes(*seq_in_denominator, "seq_in_denominator").contiguous();
  }
  if (logp) c.logp_dtype = logp->scalar_type();
  if (entropy) c.entropy_dtype = entropy->scalar_type();
  if (values) c.values_dtype = values->scalar_type();
  const auto opts = ref->options().dtype(T);
  if (grad_logp && logp) c.g_logp = token_output(c.b, opts);
  if (grad_entropy && entropy) c.g_entropy = token_output(c.b, opts);
  if (grad_values && values) c.g_values = token_output(c.b, opts);
  return c;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> finish_objective(const objective_call& c,
                                                                                        const at::Tensor& metrics) {
  const at::Tensor loss = metrics.select(0, 0).to(c.compute, /*non_blocking=*/false, /*copy=*/true);
  auto grad = [&](const at::Tensor& g, at::ScalarType dtype) {
    if (!g.defined()) return at::empty({0}, metrics.options().dtype(c.compute));
    at::Tensor v = token_view(g, c.b);
    if (!c.b.packed) v = v.view(c.b.shape); // [B, T]
    return dtype == c.compute ? v : v.to(dtype);
  };
  return {loss, grad(c.g_logp, c.logp_dtype), grad(c.g_entropy, c.entropy_dtype), grad(c.g_values, c.values_dtype),
          metrics};
}

namespace {

// --- objective (CPU) --------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
objective_cpu(c10::string_view spec, const opt_tensor& logp, const opt_tensor& mask, const opt_tensor& old_logp,
              const opt_tensor& behav_logp, const opt_tensor& ref_logp, const opt_tensor& adv,
              const opt_tensor& seq_adv, const opt_tensor& entropy, const opt_tensor& values,
              const opt_tensor& old_values, const opt_tensor& returns, const opt_tensor& cu_seqlens, bool grad_logp,
              bool grad_entropy, bool grad_values, const opt_tensor& seq_in_denominator) {
  return guard([&] {
    const objective_call c =
        prepare_objective(spec, logp, mask, old_logp, behav_logp, ref_logp, adv, seq_adv, entropy, values, old_values,
                          returns, cu_seqlens, grad_logp, grad_entropy, grad_values, seq_in_denominator);
    const rlpt::token_layout layout = c.b.host_layout();
    const rlpt::objective_result r = c.compute == at::kDouble
                                         ? rlpt::evaluate(c.obj, inputs_of<double, rlpt::memory_space::host>(c, layout),
                                                          grads_of<double, rlpt::memory_space::host>(c))
                                         : rlpt::evaluate(c.obj, inputs_of<float, rlpt::memory_space::host>(c, layout),
                                                          grads_of<float, rlpt::memory_space::host>(c));
    at::Tensor metrics = at::empty({num_metrics}, at::TensorOptions().dtype(at::kDouble));
    std::memcpy(metrics.data_ptr<double>(), &r, sizeof r);
    return finish_objective(c, metrics);
  });
}

// A call's share of a step-wide quantity, from the objective and its inputs as host copies in
// the compute type: two doubles (the local_denominators and local_is_weights ops, Share below).
template <class Share>
at::Tensor local_share(c10::string_view spec, const opt_tensor& logp, const opt_tensor& mask,
                       const opt_tensor& old_logp, const opt_tensor& behav_logp, const opt_tensor& ref_logp,
                       const opt_tensor& adv, const opt_tensor& seq_adv, const opt_tensor& entropy,
                       const opt_tensor& values, const opt_tensor& old_values, const opt_tensor& returns,
                       const opt_tensor& cu_seqlens, const opt_tensor& seq_in_denominator) {
  return guard([&] {
    auto cpu = [](const opt_tensor& t) { return t ? opt_tensor(t->cpu()) : std::nullopt; };
    const objective_call c = prepare_objective(
        spec, cpu(logp), cpu(mask), cpu(old_logp), cpu(behav_logp), cpu(ref_logp), cpu(adv), cpu(seq_adv), cpu(entropy),
        cpu(values), cpu(old_values), cpu(returns), cu_seqlens, false, false, false, cpu(seq_in_denominator));
    const rlpt::token_layout layout = c.b.host_layout();
    const std::array<double, 2> d = c.compute == at::kDouble
                                        ? Share{}(c.obj, inputs_of<double, rlpt::memory_space::host>(c, layout))
                                        : Share{}(c.obj, inputs_of<float, rlpt::memory_space::host>(c, layout));
    at::Tensor out = at::empty({2}, at::TensorOptions().dtype(at::kDouble));
    out.data_ptr<double>()[0] = d[0];
    out.data_ptr<double>()[1] = d[1];
    return out;
  });
}

//! [tokens, seqs]: rlpt::local_denominators.
struct denominators_share {
  template <class In> std::array<double, 2> operator()(const rlpt::objective& o, const In& in) const {
    const rlpt::loss_denominators d = rlpt::local_denominators(o, in);
    return {d.tokens, d.seqs};
  }
};

//! [sum, count]: rlpt::local_is_weights.
struct is_weights_share {
  template <class In> std::array<double, 2> operator()(const rlpt::objective& o, const In& in) const {
    const rlpt::is_weight_sums w = rlpt::local_is_weights(o, in);
    return {w.sum, w.count};
  }
};

//! rlpt::m2po_mask on host copies: the mask M2PO keeps, as bytes in the log-probs' [B, T] / [N] shape.
at::Tensor m2po_mask_op(const at::Tensor& old_logp, const at::Tensor& behav_logp, const opt_tensor& mask,
                        const opt_tensor& cu_seqlens, double m2_threshold) {
  return guard([&] {
    const opt_tensor old = old_logp.cpu(), behav = behav_logp.cpu();
    const opt_tensor m = mask ? opt_tensor(mask->cpu()) : std::nullopt;
    // old_logp stands for the layout's reference tensor (logp) too; nothing else is read.
    const objective_call c =
        prepare_objective("", old, m, old, behav, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                          std::nullopt, std::nullopt, cu_seqlens, false, false, false);
    const rlpt::token_layout layout = c.b.host_layout();
    at::Tensor out = token_output(c.b, at::TensorOptions().dtype(at::kByte));
    const rlpt::view<rlpt::mask_t> o(out.data_ptr<uint8_t>(), out.numel());
    if (c.compute == at::kDouble)
      rlpt::m2po_mask(inputs_of<double, rlpt::memory_space::host>(c, layout), m2_threshold, o);
    else
      rlpt::m2po_mask(inputs_of<float, rlpt::memory_space::host>(c, layout), m2_threshold, o);
    at::Tensor v = token_view(out, c.b);
    if (!c.b.packed) v = v.view(c.b.shape);
    return v.to(old_logp.device());
  });
}

//! rlpt::logprob_mismatch on host copies: the metrics as float64 [mismatch_fields], in
//! rlpt::mismatch_metrics' order (rlpt._ops.MISMATCH).
at::Tensor mismatch_metrics_op(const at::Tensor& trainer_logp, const at::Tensor& rollout_logp, const opt_tensor& mask,
                               const opt_tensor& cu_seqlens, double eps_low, double eps_high, double log_ratio_clamp,
                               bool mask_nonfinite) {
  return guard([&] {
    const opt_tensor trainer = trainer_logp.cpu(), rollout = rollout_logp.cpu();
    const opt_tensor m = mask ? opt_tensor(mask->cpu()) : std::nullopt;
    // The trainer's log-probs stand for the layout's reference tensor (logp) and old_logp, the
    // rollout's for behav_logp: the shape, mask and dtype rules of every objective input.
    const objective_call c =
        prepare_objective("", trainer, m, trainer, rollout, std::nullopt, std::nullopt, std::nullopt, std::nullopt,
                          std::nullopt, std::nullopt, std::nullopt, cu_seqlens, false, false, false);
    const rlpt::token_layout layout = c.b.host_layout();
    const rlpt::mismatch_options o{.eps_low = eps_low,
                                   .eps_high = eps_high,
                                   .log_ratio_clamp = log_ratio_clamp,
                                   .nonfinite = mask_nonfinite ? rlpt::nonfinite::mask : rlpt::nonfinite::raise};
    auto run = [&]<class T>(const rlpt::basic_objective_inputs<T>& in) {
      return rlpt::logprob_mismatch<T>(
          {.layout = layout, .mask = in.mask, .trainer_logp = in.old_logp, .rollout_logp = in.behav_logp}, o);
    };
    const rlpt::mismatch_metrics r = c.compute == at::kDouble
                                         ? run(inputs_of<double, rlpt::memory_space::host>(c, layout))
                                         : run(inputs_of<float, rlpt::memory_space::host>(c, layout));
    const double v[] = {r.tokens,
                        r.seqs,
                        r.nonfinite_tokens,
                        r.k1,
                        r.k3,
                        r.abs_diff_mean,
                        r.abs_diff_max,
                        r.prob_abs_diff_mean,
                        r.prob_abs_diff_max,
                        r.prob_abs_diff_std,
                        r.pearson_logp,
                        r.pearson_prob,
                        r.out_of_band,
                        r.chi2_token,
                        r.chi2_seq,
                        r.trainer_ppl,
                        r.rollout_ppl,
                        r.trainer_log_ppl,
                        r.rollout_log_ppl,
                        r.log_ppl_diff,
                        r.log_ppl_abs_diff,
                        r.log_ppl_diff_max,
                        r.log_ppl_diff_min,
                        r.ppl_ratio};
    static_assert(std::size(v) == mismatch_fields);
    at::Tensor out = at::empty({static_cast<std::int64_t>(std::size(v))}, at::TensorOptions().dtype(at::kDouble));
    std::memcpy(out.data_ptr<double>(), v, sizeof v);
    return out;
  });
}

// --- advantages (CPU; CUDA tensors are computed on the host, see docs/python.md) ---------------

//! Runs a host estimator on CPU copies of CUDA inputs and moves the results back.
at::Tensor host(const at::Tensor& t) { return t.device().is_cpu() ? t : t.cpu(); }
opt_tensor host(const opt_tensor& t) { return t ? opt_tensor(host(*t)) : std::nullopt; }

//! A one-value-per-row input of the host estimators as a contiguous float32 CPU tensor; `what`
//! names it, `per` says what each value is (for the shape error).
at::Tensor host_rows(const at::Tensor& t, std::string_view what, std::string_view per) {
  if (t.dim() != 1) raise(ids::shape, fmt::format("{} has shape {}; it is {}", what, dims(t.sizes()), per));
  return contiguous_as(host(t), at::kFloat, what);
}

at::Tensor stats_tensor(const rlpt::group_stats& s) {
  at::Tensor out = at::empty({4}, at::TensorOptions().dtype(at::kDouble));
  double* p = out.data_ptr<double>();
  p[0] = static_cast<double>(s.num_degenerate);
  p[1] = s.frac_degenerate;
  p[2] = static_cast<double>(s.num_nonfinite);
  p[3] = s.batch_std;
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> outcome_advantages(c10::string_view spec, const at::Tensor& rewards_in,
                                                                  const at::Tensor& group_ids,
                                                                  const opt_tensor& lengths) {
  return guard([&] {
    const outcome_options o = outcome_from_spec(std::string_view(spec.data(), spec.size()));
    const at::Tensor rewards = host_rows(rewards_in, "rewards", "one reward per sequence [B] for outcome estimators");
    const at::Tensor ids = contiguous_as(host(group_ids), at::kLong, "group_ids");
    const rlpt::groups g = rlpt::groups::from_ids(view_of<const int64_t>(ids));
    at::Tensor adv = at::empty({rewards.numel()}, rewards.options());
    const auto r = view_of<const float>(rewards);
    const auto out = view_of<float>(adv);
    rlpt::group_stats st;
    if (o.estimator == "grpo")
      rlpt::grpo_advantages(r, g, out, o.grpo, st);
    else if (o.estimator == "rloo")
      rlpt::rloo_advantages(r, g, out, o.rloo, st);
    else if (o.estimator == "gpg")
      rlpt::gpg_advantages(r, g, out, o.gpg, st);
    else if (o.estimator == "passk")
      rlpt::passk_advantages(r, g, out, o.passk, st);
    else {
      if (!lengths) raise(ids::shape, "opo advantages need lengths (valid tokens per sequence)");
      const at::Tensor len = contiguous_as(host(*lengths), at::kLong, "lengths");
      rlpt::opo_advantages(r, view_of<const int64_t>(len), g, out, o.opo, st);
    }
    const std::vector<rlpt::mask_t> counted = rlpt::nondegenerate_items(g, st);
    at::Tensor nondegenerate = at::empty({rewards.numel()}, rewards.options().dtype(at::kBool));
    std::memcpy(nondegenerate.data_ptr<bool>(), counted.data(), counted.size()); // 0 / 1 bytes are bools
    return std::make_tuple(adv.to(rewards_in.device()), stats_tensor(st), nondegenerate.to(rewards_in.device()));
  });
}

//! rlpt::step_returns on host copies: one discounted return per step row, float32 on the rows' device.
at::Tensor step_returns_op(const at::Tensor& rewards_in, const at::Tensor& traj_ids, double gamma,
                           bool mask_nonfinite) {
  return guard([&] {
    const at::Tensor rewards = host_rows(rewards_in, "step_rewards", "one reward per step row [N]");
    const at::Tensor ids = contiguous_as(host(traj_ids), at::kLong, "traj_ids");
    const rlpt::groups g = rlpt::groups::from_ids(view_of<const int64_t>(ids));
    at::Tensor out = at::empty({rewards.numel()}, rewards.options());
    rlpt::step_returns(view_of<const float>(rewards), g, gamma, view_of<float>(out),
                       mask_nonfinite ? rlpt::nonfinite::mask : rlpt::nonfinite::raise);
    return out.to(rewards_in.device());
  });
}

//! rlpt::gigpo_advantages on host copies, the anchor groups from (episode id, anchor id) pairs:
//! (advantages float32 [N], both levels' group stats float64 [2, 4] in GROUP_STATS order).
std::tuple<at::Tensor, at::Tensor> gigpo_op(const at::Tensor& scores_in, const at::Tensor& episode_ids,
                                            const at::Tensor& returns_in, const at::Tensor& anchor_ids,
                                            c10::string_view mode, double step_advantage_w, double epsilon,
                                            bool mask_nonfinite) {
  return guard([&] {
    const at::Tensor scores = host_rows(scores_in, "episode_scores", "one score per step row [N]");
    const at::Tensor returns = host_rows(returns_in, "step_returns", "one return per step row [N]");
    const at::Tensor eids = contiguous_as(host(episode_ids), at::kLong, "episode_ids");
    const at::Tensor aids = contiguous_as(host(anchor_ids), at::kLong, "anchor_ids");
    const rlpt::groups episodes = rlpt::groups::from_ids(view_of<const int64_t>(eids));
    const rlpt::groups anchors = rlpt::anchor_groups(episodes, view_of<const int64_t>(aids));
    rlpt::gigpo_options o =
        rlpt::compat::verl_agent::gigpo(std::string_view(mode.data(), mode.size()), step_advantage_w, epsilon);
    o.on_nonfinite = mask_nonfinite ? rlpt::nonfinite::mask : rlpt::nonfinite::raise;
    at::Tensor adv = at::empty({scores.numel()}, scores.options());
    rlpt::gigpo_stats st;
    rlpt::gigpo_advantages(view_of<const float>(scores), episodes, view_of<const float>(returns), anchors,
                           view_of<float>(adv), o, st);
    const at::Tensor stats = at::stack({stats_tensor(st.episode), stats_tensor(st.step)});
    return std::make_tuple(adv.to(scores_in.device()), stats);
  });
}

//! rlpt::compat::areal::normalize on host copies: x [B] or [B, T] (rows: its first dimension), an
//! optional mask of x's shape; float32 out, on x's device.
at::Tensor areal_normalize(const at::Tensor& x_in, const opt_tensor& mask, c10::string_view mean_level,
                           bool mean_leave1out, c10::string_view std_level, bool std_unbiased, double eps,
                           int64_t group_size) {
  return guard([&] {
    if (x_in.dim() != 1 && x_in.dim() != 2)
      raise(ids::shape, fmt::format("areal_normalize: x has shape {}; it takes [B] or [B, T]", dims(x_in.sizes())));
    const at::Tensor x = contiguous_as(host(x_in), at::kFloat, "x");
    opt_tensor m;
    if (mask) {
      if (mask->sizes() != x_in.sizes())
        raise(ids::shape,
              fmt::format("areal_normalize: mask has shape {}, x {}", dims(mask->sizes()), dims(x_in.sizes())));
      m = contiguous_as(mask_bytes(host(*mask), "mask"), at::kByte, "mask");
    }
    const rlpt::compat::areal::norm_config c{.mean_level = std::string(mean_level.data(), mean_level.size()),
                                             .mean_leave1out = mean_leave1out,
                                             .std_level = std::string(std_level.data(), std_level.size()),
                                             .std_unbiased = std_unbiased,
                                             .eps = eps,
                                             .group_size = group_size};
    at::Tensor out = at::empty(x.sizes(), x.options());
    rlpt::compat::areal::normalize(c, x.dim() == 0 ? 0 : x.size(0), view_of<const float>(x),
                                   m ? rlpt::view<const rlpt::mask_t>(m->data_ptr<uint8_t>(), m->numel())
                                     : rlpt::view<const rlpt::mask_t>{},
                                   view_of<float>(out));
    return out.to(x_in.device());
  });
}

at::Tensor whiten_stats(const std::optional<rlpt::whiten_result>& w, index_t zeroed) {
  at::Tensor out = at::zeros({4}, at::TensorOptions().dtype(at::kDouble));
  double* p = out.data_ptr<double>();
  p[0] = static_cast<double>(zeroed);
  if (w) {
    p[1] = w->mean;
    p[2] = w->inv_std;
    p[3] = static_cast<double>(w->num_nonfinite);
  }
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gae_cpu(c10::string_view spec, const at::Tensor& rewards,
                                                       const at::Tensor& values, const opt_tensor& mask,
                                                       const opt_tensor& cu_seqlens, const opt_tensor& bootstrap) {
  return guard([&] {
    const rlpt::gae_options o = gae_from_spec(std::string_view(spec.data(), spec.size()));
    const at::Tensor r0 = host(rewards), v0 = host(values);
    const opt_tensor m0 = mask ? opt_tensor(mask_bytes(host(*mask), "mask")) : std::nullopt;
    const token_batch b = describe(r0, "rewards", cu_seqlens, {{&m0, at::kByte, "mask"}});
    const at::Tensor r = token_input(r0, at::kFloat, b, "rewards"), v = token_input(v0, at::kFloat, b, "values");
    const opt_tensor m = m0 ? opt_tensor(token_input(*m0, at::kByte, b, "mask")) : std::nullopt;
    const opt_tensor boot =
        bootstrap ? opt_tensor(contiguous_as(host(*bootstrap), at::kFloat, "bootstrap")) : std::nullopt;
    at::Tensor adv = token_output(b, r.options()), ret = token_output(b, r.options());
    const rlpt::gae_inputs in{.layout = b.host_layout(),
                              .rewards = {r.data_ptr<float>(), b.N},
                              .values = {v.data_ptr<float>(), b.N},
                              .mask = m ? rlpt::view<const rlpt::mask_t>(m->data_ptr<uint8_t>(), b.N)
                                        : rlpt::view<const rlpt::mask_t>{},
                              .bootstrap = view_of<const float>(boot)};
    const rlpt::gae_result res = rlpt::gae(in, {adv.data_ptr<float>(), b.N}, {ret.data_ptr<float>(), b.N}, o);
    return std::make_tuple(token_view(adv, b).to(rewards.device()), token_view(ret, b).to(rewards.device()),
                           whiten_stats(res.whitening, res.num_nonfinite_seqs));
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> reinforce_pp_cpu(c10::string_view spec, const at::Tensor& token_rewards,
                                                                const opt_tensor& mask, const opt_tensor& cu_seqlens) {
  return guard([&] {
    const rlpt::reinforce_pp_options o = reinforce_pp_from_spec(std::string_view(spec.data(), spec.size()));
    const at::Tensor r0 = host(token_rewards);
    const opt_tensor m0 = mask ? opt_tensor(mask_bytes(host(*mask), "mask")) : std::nullopt;
    const token_batch b = describe(r0, "token_rewards", cu_seqlens, {{&m0, at::kByte, "mask"}});
    const at::Tensor r = token_input(r0, at::kFloat, b, "token_rewards");
    const opt_tensor m = m0 ? opt_tensor(token_input(*m0, at::kByte, b, "mask")) : std::nullopt;
    at::Tensor adv = token_output(b, r.options()), ret = token_output(b, r.options());
    const auto res = rlpt::reinforce_pp_advantages(b.host_layout(), {r.data_ptr<float>(), b.N},
                                                   m ? rlpt::view<const rlpt::mask_t>(m->data_ptr<uint8_t>(), b.N)
                                                     : rlpt::view<const rlpt::mask_t>{},
                                                   {adv.data_ptr<float>(), b.N}, {ret.data_ptr<float>(), b.N}, o);
    return std::make_tuple(token_view(adv, b).to(token_rewards.device()), token_view(ret, b).to(token_rewards.device()),
                           whiten_stats(res.whitening, res.num_nonfinite_seqs));
  });
}

std::tuple<at::Tensor, at::Tensor> reinforce_pp_baseline_cpu(c10::string_view spec, const at::Tensor& rewards,
                                                             const at::Tensor& group_ids, const at::Tensor& mask,
                                                             const opt_tensor& cu_seqlens) {
  return guard([&] {
    const rlpt::reinforce_baseline_options o = reinforce_baseline_from_spec(std::string_view(spec.data(), spec.size()));
    const opt_tensor m0 = mask_bytes(host(mask), "mask");
    const token_batch b = describe(*m0, "mask", cu_seqlens, {{&m0, at::kByte, "mask"}});
    const at::Tensor m = token_input(*m0, at::kByte, b, "mask");
    const at::Tensor r = contiguous_as(host(rewards), at::kFloat, "rewards");
    const at::Tensor ids = contiguous_as(host(group_ids), at::kLong, "group_ids");
    const rlpt::groups g = rlpt::groups::from_ids(view_of<const int64_t>(ids));
    at::Tensor adv = token_output(b, r.options());
    const auto res = rlpt::reinforce_pp_baseline_advantages(
        view_of<const float>(r), g, b.host_layout(), {m.data_ptr<uint8_t>(), b.N}, {adv.data_ptr<float>(), b.N}, o);
    at::Tensor st = whiten_stats(res.whitening, res.groups.num_nonfinite);
    return std::make_tuple(token_view(adv, b).to(rewards.device()), st);
  });
}

std::tuple<at::Tensor, at::Tensor> remax_cpu(c10::string_view spec, const at::Tensor& token_rewards,
                                             const at::Tensor& baselines, const opt_tensor& mask,
                                             const opt_tensor& cu_seqlens) {
  return guard([&] {
    const rlpt::remax_options o = remax_from_spec(std::string_view(spec.data(), spec.size()));
    const at::Tensor r0 = host(token_rewards);
    const opt_tensor m0 = mask ? opt_tensor(mask_bytes(host(*mask), "mask")) : std::nullopt;
    const token_batch b = describe(r0, "token_rewards", cu_seqlens, {{&m0, at::kByte, "mask"}});
    const at::Tensor r = token_input(r0, at::kFloat, b, "token_rewards");
    const opt_tensor m = m0 ? opt_tensor(token_input(*m0, at::kByte, b, "mask")) : std::nullopt;
    const at::Tensor bl = contiguous_as(host(baselines), at::kFloat, "baselines");
    at::Tensor adv = token_output(b, r.options()), ret = token_output(b, r.options());
    rlpt::remax_advantages(b.host_layout(), {r.data_ptr<float>(), b.N},
                           m ? rlpt::view<const rlpt::mask_t>(m->data_ptr<uint8_t>(), b.N)
                             : rlpt::view<const rlpt::mask_t>{},
                           view_of<const float>(bl), {adv.data_ptr<float>(), b.N}, {ret.data_ptr<float>(), b.N}, o);
    return std::make_tuple(token_view(adv, b).to(token_rewards.device()),
                           token_view(ret, b).to(token_rewards.device()));
  });
}

} // namespace
} // namespace rlpt_py

TORCH_LIBRARY(rlpt, m) {
  m.def("logprob_entropy(Tensor logits, Tensor tokens, Tensor? valid, Tensor? cu_seqlens, bool sequence, "
        "float temperature, int top_k, float top_p, int ignore_index, float min_p=0., bool min_p_first=True) "
        "-> (Tensor logp, Tensor entropy, Tensor lse, Tensor threshold, Tensor tie_last, Tensor scored)");
  m.def("logprob_entropy_backward(Tensor? dlogp, Tensor? dentropy, Tensor logits, Tensor tokens, Tensor? valid, "
        "Tensor? cu_seqlens, Tensor logp, Tensor entropy, Tensor lse, Tensor threshold, Tensor tie_last, "
        "bool sequence, float temperature, int top_k, float top_p, int ignore_index, float min_p=0., "
        "bool min_p_first=True) -> Tensor");
  m.def("objective(str spec, Tensor? logp, Tensor? mask, Tensor? old_logp, Tensor? behav_logp, Tensor? ref_logp, "
        "Tensor? adv, Tensor? seq_adv, Tensor? entropy, Tensor? values, Tensor? old_values, Tensor? returns, "
        "Tensor? cu_seqlens, bool grad_logp, bool grad_entropy, bool grad_values, Tensor? seq_in_denominator=None) "
        "-> (Tensor loss, Tensor grad_logp, Tensor grad_entropy, Tensor grad_values, Tensor metrics)");
  m.def("local_denominators(str spec, Tensor? logp, Tensor? mask, Tensor? old_logp, Tensor? behav_logp, "
        "Tensor? ref_logp, Tensor? adv, Tensor? seq_adv, Tensor? entropy, Tensor? values, Tensor? old_values, "
        "Tensor? returns, Tensor? cu_seqlens, Tensor? seq_in_denominator=None) -> Tensor");
  m.def("local_is_weights(str spec, Tensor? logp, Tensor? mask, Tensor? old_logp, Tensor? behav_logp, "
        "Tensor? ref_logp, Tensor? adv, Tensor? seq_adv, Tensor? entropy, Tensor? values, Tensor? old_values, "
        "Tensor? returns, Tensor? cu_seqlens, Tensor? seq_in_denominator=None) -> Tensor");
  m.def("m2po_mask(Tensor old_logp, Tensor behav_logp, Tensor? mask, Tensor? cu_seqlens, float m2_threshold) "
        "-> Tensor");
  m.def("mismatch_metrics(Tensor trainer_logp, Tensor rollout_logp, Tensor? mask, Tensor? cu_seqlens, float eps_low, "
        "float eps_high, float log_ratio_clamp, bool mask_nonfinite) -> Tensor");
  m.def("outcome_advantages(str spec, Tensor rewards, Tensor group_ids, Tensor? lengths) -> (Tensor, Tensor, Tensor)");
  m.def("step_returns(Tensor step_rewards, Tensor traj_ids, float gamma, bool mask_nonfinite) -> Tensor");
  m.def("gigpo(Tensor episode_scores, Tensor episode_ids, Tensor step_returns, Tensor anchor_ids, str mode, "
        "float step_advantage_w, float epsilon, bool mask_nonfinite) -> (Tensor, Tensor)");
  m.def("areal_normalize(Tensor x, Tensor? mask, str mean_level, bool mean_leave1out, str std_level, "
        "bool std_unbiased, float eps, int group_size) -> Tensor");
  m.def("gae(str spec, Tensor rewards, Tensor values, Tensor? mask, Tensor? cu_seqlens, Tensor? bootstrap) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("reinforce_pp(str spec, Tensor token_rewards, Tensor? mask, Tensor? cu_seqlens) -> (Tensor, Tensor, Tensor)");
  m.def("reinforce_pp_baseline(str spec, Tensor rewards, Tensor group_ids, Tensor mask, Tensor? cu_seqlens) "
        "-> (Tensor, Tensor)");
  m.def(
      "remax(str spec, Tensor token_rewards, Tensor baselines, Tensor? mask, Tensor? cu_seqlens) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(rlpt, CPU, m) {
  m.impl("objective", &rlpt_py::objective_cpu);
  m.impl("local_denominators", &rlpt_py::local_share<rlpt_py::denominators_share>);
  m.impl("local_is_weights", &rlpt_py::local_share<rlpt_py::is_weights_share>);
  m.impl("m2po_mask", &rlpt_py::m2po_mask_op);
  m.impl("mismatch_metrics", &rlpt_py::mismatch_metrics_op);
  m.impl("outcome_advantages", &rlpt_py::outcome_advantages);
  m.impl("step_returns", &rlpt_py::step_returns_op);
  m.impl("gigpo", &rlpt_py::gigpo_op);
  m.impl("gae", &rlpt_py::gae_cpu);
  m.impl("reinforce_pp", &rlpt_py::reinforce_pp_cpu);
  m.impl("reinforce_pp_baseline", &rlpt_py::reinforce_pp_baseline_cpu);
  m.impl("remax", &rlpt_py::remax_cpu);
  m.impl("areal_normalize", &rlpt_py::areal_normalize);
}

// Estimators read a few floats per sequence: on CUDA tensors they run on the host (one copy
// each way, documented); local_denominators, local_is_weights and m2po_mask read CPU copies.
TORCH_LIBRARY_IMPL(rlpt, CUDA, m) {
  m.impl("local_denominators", &rlpt_py::local_share<rlpt_py::denominators_share>);
  m.impl("local_is_weights", &rlpt_py::local_share<rlpt_py::is_weights_share>);
  m.impl("m2po_mask", &rlpt_py::m2po_mask_op);
  m.impl("mismatch_metrics", &rlpt_py::mismatch_metrics_op);
  m.impl("outcome_advantages", &rlpt_py::outcome_advantages);
  m.impl("step_returns", &rlpt_py::step_returns_op);
  m.impl("gigpo", &rlpt_py::gigpo_op);
  m.impl("gae", &rlpt_py::gae_cpu);
  m.impl("reinforce_pp", &rlpt_py::reinforce_pp_cpu);
  m.impl("reinforce_pp_baseline", &rlpt_py::reinforce_pp_baseline_cpu);
  m.impl("remax", &rlpt_py::remax_cpu);
  m.impl("areal_normalize", &rlpt_py::areal_normalize);
}
