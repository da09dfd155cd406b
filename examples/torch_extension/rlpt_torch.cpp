// SPDX-License-Identifier: Apache-2.0
// rlpt_torch._C: rlpt's host blocks on torch CPU tensors, without copies. Every input tensor is
// exported with at::toDLPack and imported with rlpt::from_dlpack, so rlpt validates device,
// dtype, rank and strides and reads the tensor's own memory; outputs are torch tensors rlpt
// writes into. The autograd wiring (torch.autograd.Function) is in rlpt_torch/__init__.py.
#include <ATen/DLConvertor.h>
#include <torch/extension.h>

#include <rlpt/advantage.hpp>
#include <rlpt/core/dlpack.hpp>
#include <rlpt/logprob.hpp>
#include <rlpt/objective.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace py = pybind11;
using rlpt::index_t;
using opt_tensor = std::optional<at::Tensor>;

namespace {

// ---------------------------------------------------------------------------------------------
// tensors -> rlpt views (zero-copy)

//! The DLPack description of `t`, released on scope exit (the caller's tensor keeps the memory).
struct dl_ref {
  explicit dl_ref(const at::Tensor& t) : m(at::toDLPack(t)) {}
  dl_ref(const dl_ref&) = delete;
  dl_ref& operator=(const dl_ref&) = delete;
  ~dl_ref() {
    if (m != nullptr && m->deleter != nullptr) m->deleter(m);
  }
  const DLTensor& operator*() const { return m->dl_tensor; }
  DLManagedTensor* m;
};

//! Per-token and per-sequence tensors are read as flat arrays: they must be contiguous (a
//! [B, T] padded batch or a packed [N] one), which makes the flattening a view, never a copy.
std::string dims(at::IntArrayRef d) {
  std::string s = "[";
  for (std::size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

at::Tensor flat(const at::Tensor& t, std::string_view what) {
  RLPT_CHECK(t.is_contiguous(), "rlpt.torch.strides", "{} (shape {}, strides {}) must be contiguous; call .contiguous() on it",
             what, dims(t.sizes()), dims(t.strides()));
  return t.reshape({-1});
}

template <class T>
rlpt::view<T> view_of(const at::Tensor& t, std::string_view what) {
  at::Tensor f = flat(t, what);
  // torch < 2.1 cannot export bool through DLPack; a bool mask is read as its bytes (0 / 1).
  if (std::is_same_v<std::remove_const_t<T>, rlpt::mask_t> && f.scalar_type() == at::kBool) f = f.view(at::kByte);
  const dl_ref d(f);
  return rlpt::from_dlpack<T>(*d, what);
}

template <class T>
rlpt::view<T> view_of(const opt_tensor& t, std::string_view what) {
  return t ? view_of<T>(*t, what) : rlpt::view<T>{};
}

template <class T>
rlpt::view2d<T> rows_of(const at::Tensor& t, std::string_view what) {
  const dl_ref d(t);
  return rlpt::from_dlpack_2d<T>(*d, what);
}

at::Tensor empty_like_f32(const at::Tensor& t) { return at::empty(t.sizes(), t.options().dtype(at::kFloat)); }

//! The token layout of per-token tensors: [B, T] padded, or [N] packed with cu_seqlens [B + 1].
rlpt::token_layout layout_of(const at::Tensor& per_token, const opt_tensor& cu_seqlens, std::string_view what) {
  if (cu_seqlens) {
    RLPT_CHECK(per_token.dim() == 1, "rlpt.torch.shape",
               "{} has {} dimensions; with cu_seqlens (packed sequences) it must be 1-D [N]", what, per_token.dim());
    return rlpt::token_layout::packed(view_of<const index_t>(*cu_seqlens, "cu_seqlens"));
  }
  RLPT_CHECK(per_token.dim() == 2, "rlpt.torch.shape",
             "{} has {} dimensions; padded batches are [B, T] (or pass cu_seqlens for packed [N])", what,
             per_token.dim());
  return rlpt::token_layout::padded(per_token.size(0), per_token.size(1));
}

// ---------------------------------------------------------------------------------------------
// keyword options

//! Reads keyword options by name; anything left over is an error naming it.
class kwargs_reader {
public:
  kwargs_reader(const py::kwargs& kw, std::string_view who) : kw_(kw), who_(who) {}

  template <class T>
  void get(const char* key, T& out) {
    if (!kw_.contains(key)) return;
    used_.emplace_back(key);
    const py::handle v = kw_[key];
    if constexpr (std::is_same_v<T, std::string_view>) {
      strings_->push_back(v.cast<std::string>());
      out = strings_->back();
    } else if constexpr (requires { typename T::value_type; } && !std::is_same_v<T, std::string>) {
      if (v.is_none())
        out.reset();
      else
        out = v.cast<typename T::value_type>();
    } else {
      out = v.cast<T>();
    }
  }

  void finish() const {
    for (const auto& item : kw_) {
      const std::string k = item.first.cast<std::string>();
      bool known = false;
      for (const auto& u : used_) known = known || u == k;
      RLPT_CHECK(known, "rlpt.torch.bad_option", "{}: unknown option '{}'", who_, k);
    }
  }

  //! String storage that outlives the string_views handed to presets.
  std::shared_ptr<std::vector<std::string>> strings_ = std::make_shared<std::vector<std::string>>();

private:
  const py::kwargs& kw_;
  std::string who_;
  std::vector<std::string> used_;
};

rlpt::scale parse_scale(std::string_view s) {
  if (s == "group" || s == "group_std") return rlpt::scale::group_std;
  if (s == "batch" || s == "batch_std") return rlpt::scale::batch_std;
  if (s == "none") return rlpt::scale::none;
  RLPT_FAIL("rlpt.torch.bad_option", "scale '{}' is not one of group, batch, none", s);
}

rlpt::single parse_single(std::string_view s) {
  if (s == "raw") return rlpt::single::raw;
  if (s == "zero") return rlpt::single::zero;
  if (s == "raise") return rlpt::single::raise;
  RLPT_FAIL("rlpt.torch.bad_option", "single '{}' is not one of raw, zero, raise", s);
}

rlpt::nonfinite parse_nonfinite(std::string_view s) {
  if (s == "raise") return rlpt::nonfinite::raise;
  if (s == "mask") return rlpt::nonfinite::mask;
  RLPT_FAIL("rlpt.torch.bad_option", "on_nonfinite '{}' is not one of raise, mask", s);
}

rlpt::mask_mode parse_mask_mode(std::string_view s) {
  if (s == "skip") return rlpt::mask_mode::skip;
  if (s == "zero") return rlpt::mask_mode::zero;
  if (s == "reset") return rlpt::mask_mode::reset;
  RLPT_FAIL("rlpt.torch.bad_option", "masked '{}' is not one of skip, zero, reset", s);
}

[[noreturn]] void unknown_preset(std::string_view who, std::string_view preset, std::string_view known) {
  RLPT_FAIL("rlpt.torch.bad_option", "{}: unknown preset '{}' (known: {})", who, preset, known);
}

// ---------------------------------------------------------------------------------------------
// advantages

py::dict stats_dict(const rlpt::group_stats& s) {
  py::dict d;
  d["mean"] = s.mean;
  d["std"] = s.std;
  d["size"] = s.size;
  d["num_degenerate"] = s.num_degenerate;
  d["frac_degenerate"] = s.frac_degenerate;
  d["num_nonfinite"] = s.num_nonfinite;
  return d;
}

rlpt::grpo_options grpo_preset(std::string_view p) {
  if (p == "rlpt") return {};
  if (p == "verl") return rlpt::compat::verl::grpo();
  if (p == "trl") return rlpt::compat::trl::grpo();
  if (p == "openrlhf") return rlpt::compat::openrlhf::group_norm();
  if (p == "areal") return rlpt::compat::areal::reward_norm();
  if (p == "slime") return rlpt::compat::slime::grpo();
  unknown_preset("grpo_advantages", p, "rlpt, verl, trl, openrlhf, areal, slime");
  return {};
}

py::tuple grpo_advantages(const at::Tensor& rewards, const at::Tensor& group_ids, const std::string& preset,
                          const py::kwargs& kw) {
  rlpt::grpo_options o = grpo_preset(preset);
  kwargs_reader r(kw, "grpo_advantages");
  std::string_view scale, single, nonfinite;
  r.get("scale", scale);
  r.get("unbiased", o.unbiased);
  r.get("epsilon", o.epsilon);
  r.get("std_floor", o.std_floor);
  r.get("single", single);
  r.get("on_nonfinite", nonfinite);
  r.finish();
  if (!scale.empty()) o.scale = parse_scale(scale);
  if (!single.empty()) o.single = parse_single(single);
  if (!nonfinite.empty()) o.on_nonfinite = parse_nonfinite(nonfinite);
  const rlpt::groups g = rlpt::groups::from_ids(view_of<const std::int64_t>(group_ids, "group_ids"));
  at::Tensor adv = empty_like_f32(rewards);
  const rlpt::group_stats s =
      rlpt::grpo_advantages(view_of<const float>(rewards, "rewards"), g, view_of<float>(adv, "advantages"), o);
  return py::make_tuple(adv, stats_dict(s));
}

rlpt::rloo_options rloo_preset(std::string_view p) {
  if (p == "rlpt") return {};
  if (p == "verl") return rlpt::compat::verl::rloo();
  if (p == "verl_vectorized") return rlpt::compat::verl::rloo_vectorized();
  if (p == "trl") return rlpt::compat::trl::rloo();
  if (p == "openrlhf") return rlpt::compat::openrlhf::rloo();
  unknown_preset("rloo_advantages", p, "rlpt, verl, verl_vectorized, trl, openrlhf");
  return {};
}

py::tuple rloo_advantages(const at::Tensor& rewards, const at::Tensor& group_ids, const std::string& preset,
                          const py::kwargs& kw) {
  rlpt::rloo_options o = rloo_preset(preset);
  kwargs_reader r(kw, "rloo_advantages");
  std::string_view single, nonfinite;
  r.get("single", single);
  r.get("on_nonfinite", nonfinite);
  r.get("batch_normalize", o.batch_normalize);
  r.get("batch_epsilon", o.batch_epsilon);
  r.finish();
  if (!single.empty()) o.single = parse_single(single);
  if (!nonfinite.empty()) o.on_nonfinite = parse_nonfinite(nonfinite);
  const rlpt::groups g = rlpt::groups::from_ids(view_of<const std::int64_t>(group_ids, "group_ids"));
  at::Tensor adv = empty_like_f32(rewards);
  const rlpt::group_stats s =
      rlpt::rloo_advantages(view_of<const float>(rewards, "rewards"), g, view_of<float>(adv, "advantages"), o);
  return py::make_tuple(adv, stats_dict(s));
}

py::tuple gae(const at::Tensor& rewards, const at::Tensor& values, const opt_tensor& mask, const opt_tensor& cu_seqlens,
              double gamma, double lam, const std::string& preset, const py::kwargs& kw) {
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
    unknown_preset("gae", preset, "rlpt, verl, openrlhf, slime, areal");
  kwargs_reader r(kw, "gae");
  std::string_view masked;
  bool whiten = o.whiten.has_value();
  r.get("masked", masked);
  r.get("whiten", whiten);
  r.finish();
  if (!masked.empty()) o.masked = parse_mask_mode(masked);
  if (!whiten) o.whiten.reset();
  if (whiten && !o.whiten) o.whiten = rlpt::whiten_options{};
  const rlpt::token_layout layout = layout_of(rewards, cu_seqlens, "rewards");
  at::Tensor adv = empty_like_f32(rewards);
  at::Tensor ret = empty_like_f32(rewards);
  const rlpt::gae_inputs in{.layout = layout,
                            .rewards = view_of<const float>(rewards, "rewards"),
                            .values = view_of<const float>(values, "values"),
                            .mask = view_of<const rlpt::mask_t>(mask, "mask")};
  const rlpt::gae_result res = rlpt::gae(in, view_of<float>(adv, "advantages"), view_of<float>(ret, "returns"), o);
  py::dict d;
  d["num_nonfinite_seqs"] = res.num_nonfinite_seqs;
  if (res.whitening) {
    d["whiten_mean"] = res.whitening->stats.mean;
    d["whiten_count"] = res.whitening->stats.count;
  }
  return py::make_tuple(adv, ret, d);
}

// ---------------------------------------------------------------------------------------------
// logprob / entropy

rlpt::logprob_options logprob_opts(double temperature, index_t top_k, double top_p, index_t ignore_index) {
  return {.temperature = static_cast<float>(temperature),
          .top_k = top_k,
          .top_p = static_cast<float>(top_p),
          .ignore_index = ignore_index,
          .on_dropped = rlpt::dropped_target::neg_inf};
}

//! How logits rows map to targets: plain ([N, V] with targets [N]), padded sequences
//! ([B, T, V] with tokens [B, T]) or packed sequences ([N, V], tokens [N], cu_seqlens).
struct rows_spec {
  at::Tensor logits2d;
  rlpt::token_layout layout{};
  bool sequence = false;
};

rows_spec rows_for(const at::Tensor& logits, const at::Tensor& tokens, bool sequence, const opt_tensor& cu_seqlens) {
  rows_spec s;
  s.sequence = sequence;
  if (sequence && !cu_seqlens) {
    RLPT_CHECK(logits.dim() == 3 && tokens.dim() == 2, "rlpt.torch.shape",
               "padded sequences take logits [B, T, V] and tokens [B, T], got {} and {} dimensions", logits.dim(),
               tokens.dim());
    RLPT_CHECK(logits.size(0) == tokens.size(0) && logits.size(1) == tokens.size(1), "rlpt.torch.shape",
               "logits are [{}, {}, V] but tokens are [{}, {}]", logits.size(0), logits.size(1), tokens.size(0),
               tokens.size(1));
    // [B, T, V] -> [B*T, V] must be a view (rows evenly spaced), or rlpt would read a copy.
    RLPT_CHECK(logits.size(0) <= 1 || logits.stride(0) == logits.size(1) * logits.stride(1), "rlpt.torch.strides",
               "logits [B, T, V] with strides ({}, {}, {}) cannot be read as [B*T, V] rows without a copy",
               logits.stride(0), logits.stride(1), logits.stride(2));
    s.logits2d = logits.view({logits.size(0) * logits.size(1), logits.size(2)});
    s.layout = rlpt::token_layout::padded(tokens.size(0), tokens.size(1));
    return s;
  }
  RLPT_CHECK(logits.dim() == 2 && tokens.dim() == 1, "rlpt.torch.shape",
             "logits must be [N, V] and targets [N] here, got {} and {} dimensions", logits.dim(), tokens.dim());
  s.logits2d = logits;
  if (sequence) s.layout = rlpt::token_layout::packed(view_of<const index_t>(*cu_seqlens, "cu_seqlens"));
  return s;
}

template <class T>
rlpt::logprob_stats forward_rows(const rows_spec& s, const at::Tensor& tokens, const opt_tensor& valid,
                                 const rlpt::logprob_outputs& out, const rlpt::logprob_options& o) {
  const auto x = rows_of<const T>(s.logits2d, "logits");
  const auto y = view_of<const index_t>(tokens, "tokens");
  if (s.sequence)
    return rlpt::sequence_logprob_entropy(x, y, s.layout, view_of<const rlpt::mask_t>(valid, "valid"), out, o);
  RLPT_CHECK(!valid, "rlpt.torch.bad_option", "valid is for sequences (sequence = True)");
  return rlpt::logprob_entropy(x, y, out, o);
}

template <class T>
void backward_rows(const rows_spec& s, const at::Tensor& tokens, const opt_tensor& valid, rlpt::view<const float> dlogp,
                   rlpt::view<const float> dentropy, rlpt::view<const float> entropy,
                   const rlpt::logprob_saved_view& saved, const at::Tensor& dlogits2d, const rlpt::logprob_options& o) {
  const auto x = rows_of<const T>(s.logits2d, "logits");
  const auto y = view_of<const index_t>(tokens, "tokens");
  const auto dx = rows_of<T>(dlogits2d, "dlogits");
  if (s.sequence)
    rlpt::sequence_logprob_entropy_backward(x, y, s.layout, view_of<const rlpt::mask_t>(valid, "valid"), dlogp,
                                            dentropy, entropy, saved, dx, o);
  else
    rlpt::logprob_entropy_backward(x, y, dlogp, dentropy, entropy, saved, dx, o);
}

template <class F>
decltype(auto) dispatch_logits(const at::Tensor& logits, F&& f) {
  switch (logits.scalar_type()) {
  case at::kFloat: return f(float{});
  case at::kDouble: return f(double{});
  case at::kBFloat16: return f(rlpt::bf16{});
  case at::kHalf: return f(rlpt::f16{});
  default: break;
  }
  RLPT_FAIL("rlpt.torch.dtype", "logits have dtype {}; rlpt scores float32, float64, bfloat16 and float16 logits",
            std::string(c10::toString(logits.scalar_type())));
}

//! Forward: (logp, entropy, lse, threshold, tie_last, scored) with logp/entropy/scored shaped like
//! the tokens and the saved statistics one per logits row (threshold/tie_last empty unless
//! top-k/top-p truncate).
py::tuple logprob_forward(const at::Tensor& logits, const at::Tensor& tokens, const opt_tensor& valid,
                          const opt_tensor& cu_seqlens, bool sequence, double temperature, index_t top_k, double top_p,
                          index_t ignore_index) {
  const rlpt::logprob_options o = logprob_opts(temperature, top_k, top_p, ignore_index);
  const rows_spec s = rows_for(logits, tokens, sequence, cu_seqlens);
  const index_t n = s.logits2d.size(0);
  at::Tensor logp = empty_like_f32(tokens), entropy = empty_like_f32(tokens);
  at::Tensor scored = at::empty(tokens.sizes(), tokens.options().dtype(at::kBool));
  at::Tensor lse = at::empty({n}, logits.options().dtype(at::kFloat));
  at::Tensor thr = at::empty({o.truncated() ? n : 0}, logits.options().dtype(at::kFloat));
  at::Tensor tie = at::empty({o.truncated() ? n : 0}, logits.options().dtype(at::kLong));
  rlpt::logprob_outputs out{.logp = view_of<float>(logp, "logp"),
                            .entropy = view_of<float>(entropy, "entropy"),
                            .saved = {.lse = view_of<float>(lse, "lse"),
                                      .threshold = view_of<float>(thr, "threshold"),
                                      .tie_last = view_of<index_t>(tie, "tie_last")},
                            .scored = view_of<rlpt::mask_t>(scored, "scored")};
  const rlpt::logprob_stats st =
      dispatch_logits(logits, [&](auto tag) { return forward_rows<decltype(tag)>(s, tokens, valid, out, o); });
  py::dict d;
  d["scored"] = st.scored;
  d["ignored"] = st.ignored;
  d["dropped"] = st.dropped;
  return py::make_tuple(logp, entropy, lse, thr, tie, scored, d);
}

//! Backward: d logits (dtype and shape of the logits) from dlogp / dentropy (either may be None).
at::Tensor logprob_backward(const at::Tensor& logits, const at::Tensor& tokens, const opt_tensor& valid,
                            const opt_tensor& cu_seqlens, bool sequence, const opt_tensor& dlogp,
                            const opt_tensor& dentropy, const at::Tensor& entropy, const at::Tensor& lse,
                            const at::Tensor& threshold, const at::Tensor& tie_last, double temperature, index_t top_k,
                            double top_p, index_t ignore_index) {
  const rlpt::logprob_options o = logprob_opts(temperature, top_k, top_p, ignore_index);
  const rows_spec s = rows_for(logits, tokens, sequence, cu_seqlens);
  // Upstream gradients arrive in the outputs' dtype (float32) but may be expanded or strided.
  auto f32 = [](const opt_tensor& t) { return t ? opt_tensor(t->to(at::kFloat).contiguous()) : std::nullopt; };
  const opt_tensor gl = f32(dlogp), ge = f32(dentropy);
  at::Tensor dlogits = at::empty(s.logits2d.sizes(), s.logits2d.options().memory_format(at::MemoryFormat::Contiguous));
  const rlpt::logprob_saved_view saved{view_of<const float>(lse, "lse"), view_of<const float>(threshold, "threshold"),
                                       view_of<const index_t>(tie_last, "tie_last")};
  dispatch_logits(logits, [&](auto tag) {
    backward_rows<decltype(tag)>(s, tokens, valid, view_of<const float>(gl, "dlogp"),
                                 view_of<const float>(ge, "dentropy"),
                                 ge ? view_of<const float>(entropy, "entropy") : rlpt::view<const float>{}, saved,
                                 dlogits, o);
  });
  return dlogits.view(logits.sizes());
}

// ---------------------------------------------------------------------------------------------
// policy objective

//! An rlpt::objective built from a framework preset (the framework's own option names).
struct objective_handle {
  rlpt::objective obj;
  std::string description;
};

objective_handle verl_actor(const py::kwargs& kw) {
  rlpt::compat::verl::actor_config c;
  kwargs_reader r(kw, "Objective.verl_actor");
  r.get("loss_mode", c.loss_mode);
  r.get("clip_ratio", c.clip_ratio);
  r.get("clip_ratio_low", c.clip_ratio_low);
  r.get("clip_ratio_high", c.clip_ratio_high);
  r.get("clip_ratio_c", c.clip_ratio_c);
  r.get("tau_pos", c.tau_pos);
  r.get("tau_neg", c.tau_neg);
  r.get("loss_agg_mode", c.loss_agg_mode);
  r.get("use_kl_loss", c.use_kl_loss);
  r.get("kl_loss_coef", c.kl_loss_coef);
  r.get("kl_loss_type", c.kl_loss_type);
  r.get("entropy_coeff", c.entropy_coeff);
  r.get("dp_size", c.dp_size);
  r.get("batch_num_tokens", c.batch_num_tokens);
  r.get("global_batch_size", c.global_batch_size);
  r.get("loss_scale_factor", c.loss_scale_factor);
  std::string_view rollout_is, is_threshold = "2.0", rollout_rs, rs_threshold;
  bool bypass = false;
  r.get("rollout_is", rollout_is);
  r.get("rollout_is_threshold", is_threshold);
  r.get("rollout_rs", rollout_rs);
  r.get("rollout_rs_threshold", rs_threshold);
  r.get("bypass_mode", bypass);
  r.finish();
  const rlpt::off_policy_correction corr =
      rlpt::compat::verl::rollout_correction(rollout_is, is_threshold, rollout_rs, rs_threshold, bypass);
  return {rlpt::compat::verl::actor(c, corr), fmt::format("verl actor (loss_mode {}, loss_agg_mode {})", c.loss_mode,
                                                          c.loss_agg_mode)};
}

objective_handle trl_grpo(const py::kwargs& kw) {
  rlpt::compat::trl::grpo_config c;
  kwargs_reader r(kw, "Objective.trl_grpo");
  r.get("loss_type", c.loss_type);
  r.get("epsilon", c.epsilon);
  r.get("epsilon_high", c.epsilon_high);
  r.get("delta", c.delta);
  r.get("importance_sampling_level", c.importance_sampling_level);
  r.get("beta", c.beta);
  r.get("use_bias_correction_kl", c.use_bias_correction_kl);
  r.get("sapo_temperature_pos", c.sapo_temperature_pos);
  r.get("sapo_temperature_neg", c.sapo_temperature_neg);
  r.get("entropy_coef", c.entropy_coef);
  r.get("max_completion_length", c.max_completion_length);
  r.get("gradient_accumulation_steps", c.gradient_accumulation_steps);
  r.get("num_processes", c.num_processes);
  r.get("steps_per_generation", c.steps_per_generation);
  r.get("num_items_in_batch", c.num_items_in_batch);
  r.get("vllm_importance_sampling_correction", c.vllm_importance_sampling_correction);
  r.get("vllm_importance_sampling_mode", c.vllm_importance_sampling_mode);
  r.get("vllm_importance_sampling_min", c.vllm_importance_sampling_min);
  r.get("vllm_importance_sampling_max", c.vllm_importance_sampling_max);
  r.finish();
  return {rlpt::compat::trl::grpo(c), fmt::format("TRL GRPO (loss_type {})", c.loss_type)};
}

objective_handle openrlhf_policy_loss(const py::kwargs& kw) {
  rlpt::compat::openrlhf::policy_loss_config c;
  kwargs_reader r(kw, "Objective.openrlhf_policy_loss");
  r.get("clip_eps_low", c.clip_eps_low);
  r.get("clip_eps_high", c.clip_eps_high);
  r.get("token_level_loss", c.token_level_loss);
  r.get("policy_loss_type", c.policy_loss_type);
  r.get("is_correction_level", c.is_correction_level);
  r.get("is_correction_mode", c.is_correction_mode);
  r.get("is_correction_low", c.is_correction_low);
  r.get("is_correction_high", c.is_correction_high);
  r.get("dp_size", c.dp_size);
  r.get("kl_coef", c.kl_coef);
  r.get("kl_estimator", c.kl_estimator);
  r.get("kl_unbiased_gradient", c.kl_unbiased_gradient);
  r.get("entropy_coef", c.entropy_coef);
  r.finish();
  return {rlpt::compat::openrlhf::policy_loss(c),
          fmt::format("OpenRLHF PolicyLoss ({})", c.policy_loss_type)};
}

//! The per-token inputs of one evaluate call, as tensors (None = absent).
struct objective_tensors {
  at::Tensor logp, mask;
  opt_tensor old_logp, behav_logp, ref_logp, adv, seq_adv, entropy, values, old_values, returns, cu_seqlens;
};

template <class T>
rlpt::basic_objective_inputs<T> inputs_of(const objective_tensors& t) {
  return {.layout = layout_of(t.logp, t.cu_seqlens, "logp"),
          .mask = view_of<const rlpt::mask_t>(t.mask, "mask"),
          .logp = view_of<const T>(t.logp, "logp"),
          .old_logp = view_of<const T>(t.old_logp, "old_logp"),
          .behav_logp = view_of<const T>(t.behav_logp, "behav_logp"),
          .ref_logp = view_of<const T>(t.ref_logp, "ref_logp"),
          .adv = view_of<const T>(t.adv, "adv"),
          .seq_adv = view_of<const T>(t.seq_adv, "seq_adv"),
          .entropy = view_of<const T>(t.entropy, "entropy"),
          .values = view_of<const T>(t.values, "values"),
          .old_values = view_of<const T>(t.old_values, "old_values"),
          .returns = view_of<const T>(t.returns, "returns")};
}

py::dict metrics_dict(const rlpt::objective_result& r) {
  py::dict d;
  d["loss"] = r.loss;
  d["policy_loss"] = r.policy_loss;
  d["kl_loss"] = r.kl_loss;
  d["entropy_loss"] = r.entropy_loss;
  d["value_loss"] = r.value_loss;
  d["tokens"] = r.tokens;
  d["loss_tokens"] = r.loss_tokens;
  d["seqs"] = r.seqs;
  d["clip_frac_low"] = r.clip_frac_low;
  d["clip_frac_high"] = r.clip_frac_high;
  d["clip_frac_dual"] = r.clip_frac_dual;
  d["clamped_frac"] = r.clamped_frac;
  d["approx_kl"] = r.approx_kl;
  d["kl_mean"] = r.kl_mean;
  d["is_weight_min"] = r.is_weight_min;
  d["is_weight_mean"] = r.is_weight_mean;
  d["is_weight_max"] = r.is_weight_max;
  d["rejected_frac"] = r.rejected_frac;
  d["entropy_mean"] = r.entropy_mean;
  d["value_clip_frac"] = r.value_clip_frac;
  d["nonfinite_tokens"] = r.nonfinite_tokens;
  return d;
}

//! Forward and gradients in one call: (loss, d loss/d logp, d loss/d entropy, d loss/d values,
//! metrics); a gradient is None unless asked for.
py::tuple objective_forward(const objective_handle& h, const objective_tensors& t, bool grad_logp, bool grad_entropy,
                            bool grad_values) {
  const at::ScalarType st = t.logp.scalar_type();
  RLPT_CHECK(st == at::kFloat || st == at::kDouble, "rlpt.torch.dtype",
             "logp has dtype {}; the objective takes float32 or float64", std::string(c10::toString(st)));
  auto check_same = [&](const opt_tensor& x, std::string_view what) {
    if (x)
      RLPT_CHECK(x->scalar_type() == st, "rlpt.torch.dtype", "{} has dtype {} but logp has {}; cast it", what,
                 std::string(c10::toString(x->scalar_type())), std::string(c10::toString(st)));
  };
  check_same(t.old_logp, "old_logp");
  check_same(t.behav_logp, "behav_logp");
  check_same(t.ref_logp, "ref_logp");
  check_same(t.adv, "adv");
  check_same(t.seq_adv, "seq_adv");
  check_same(t.entropy, "entropy");
  check_same(t.values, "values");
  check_same(t.old_values, "old_values");
  check_same(t.returns, "returns");
  opt_tensor gl, ge, gv;
  if (grad_logp) gl = at::empty_like(t.logp, at::MemoryFormat::Contiguous);
  if (grad_entropy && t.entropy) ge = at::empty_like(*t.entropy, at::MemoryFormat::Contiguous);
  if (grad_values && t.values) gv = at::empty_like(*t.values, at::MemoryFormat::Contiguous);
  const rlpt::objective_result r = st == at::kDouble
                                       ? rlpt::evaluate(h.obj, inputs_of<double>(t),
                                                        rlpt::basic_objective_grads<double>{
                                                            view_of<double>(gl, "grad_logp"),
                                                            view_of<double>(ge, "grad_entropy"),
                                                            view_of<double>(gv, "grad_values")})
                                       : rlpt::evaluate(h.obj, inputs_of<float>(t),
                                                        rlpt::basic_objective_grads<float>{
                                                            view_of<float>(gl, "grad_logp"),
                                                            view_of<float>(ge, "grad_entropy"),
                                                            view_of<float>(gv, "grad_values")});
  const at::Tensor loss = at::scalar_tensor(r.loss, t.logp.options());
  auto opt = [](const opt_tensor& x) { return x ? py::cast(*x) : py::none(); };
  return py::make_tuple(loss, opt(gl), opt(ge), opt(gv), metrics_dict(r));
}

py::dict local_denominators(const objective_handle& h, const objective_tensors& t) {
  const rlpt::loss_denominators d = t.logp.scalar_type() == at::kDouble
                                        ? rlpt::local_denominators(h.obj, inputs_of<double>(t))
                                        : rlpt::local_denominators(h.obj, inputs_of<float>(t));
  py::dict out;
  out["tokens"] = d.tokens;
  out["seqs"] = d.seqs;
  return out;
}

objective_tensors tensors_from(const at::Tensor& logp, const at::Tensor& mask, const py::kwargs& kw) {
  objective_tensors t;
  t.logp = logp;
  t.mask = mask;
  kwargs_reader r(kw, "policy_loss inputs");
  r.get("old_logp", t.old_logp);
  r.get("behav_logp", t.behav_logp);
  r.get("ref_logp", t.ref_logp);
  r.get("adv", t.adv);
  r.get("seq_adv", t.seq_adv);
  r.get("entropy", t.entropy);
  r.get("values", t.values);
  r.get("old_values", t.old_values);
  r.get("returns", t.returns);
  r.get("cu_seqlens", t.cu_seqlens);
  r.finish();
  return t;
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "rlpt host blocks on torch CPU tensors (zero-copy); use the rlpt_torch package, not this module";
  static py::exception<rlpt::error> rlpt_error(m, "Error", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const rlpt::error& e) {
      PyErr_SetString(rlpt_error.ptr(), e.what());
    }
  });

  m.def("grpo_advantages", &grpo_advantages, py::arg("rewards"), py::arg("group_ids"), py::arg("preset") = "verl");
  m.def("rloo_advantages", &rloo_advantages, py::arg("rewards"), py::arg("group_ids"), py::arg("preset") = "verl");
  m.def("gae", &gae, py::arg("rewards"), py::arg("values"), py::arg("mask") = py::none(),
        py::arg("cu_seqlens") = py::none(), py::arg("gamma") = 1.0, py::arg("lam") = 1.0, py::arg("preset") = "verl");

  m.def("logprob_forward", &logprob_forward, py::arg("logits"), py::arg("tokens"), py::arg("valid"),
        py::arg("cu_seqlens"), py::arg("sequence"), py::arg("temperature"), py::arg("top_k"), py::arg("top_p"),
        py::arg("ignore_index"));
  m.def("logprob_backward", &logprob_backward, py::arg("logits"), py::arg("tokens"), py::arg("valid"),
        py::arg("cu_seqlens"), py::arg("sequence"), py::arg("dlogp"), py::arg("dentropy"), py::arg("entropy"),
        py::arg("lse"), py::arg("threshold"), py::arg("tie_last"), py::arg("temperature"), py::arg("top_k"),
        py::arg("top_p"), py::arg("ignore_index"));

  py::class_<objective_handle>(m, "Objective")
      .def_static("verl_actor", &verl_actor)
      .def_static("trl_grpo", &trl_grpo)
      .def_static("openrlhf_policy_loss", &openrlhf_policy_loss)
      .def("with_denominators",
           [](const objective_handle& h, double tokens, double seqs) {
             objective_handle c = h;
             const rlpt::loss_denominators d{tokens, seqs};
             c.obj.agg = rlpt::with_denominators(c.obj.agg, d);
             if (c.obj.policy_agg) c.obj.policy_agg = rlpt::with_denominators(*c.obj.policy_agg, d);
             if (c.obj.kl_agg) c.obj.kl_agg = rlpt::with_denominators(*c.obj.kl_agg, d);
             if (c.obj.entropy_agg) c.obj.entropy_agg = rlpt::with_denominators(*c.obj.entropy_agg, d);
             if (c.obj.value_agg) c.obj.value_agg = rlpt::with_denominators(*c.obj.value_agg, d);
             return c;
           },
           py::arg("tokens"), py::arg("seqs"))
      .def("__repr__", [](const objective_handle& h) { return "rlpt_torch.Objective(" + h.description + ")"; });

  m.def(
      "objective_forward",
      [](const objective_handle& h, const at::Tensor& logp, const at::Tensor& mask, bool grad_logp, bool grad_entropy,
         bool grad_values, const py::kwargs& kw) {
        return objective_forward(h, tensors_from(logp, mask, kw), grad_logp, grad_entropy, grad_values);
      },
      py::arg("objective"), py::arg("logp"), py::arg("mask"), py::arg("grad_logp"), py::arg("grad_entropy"),
      py::arg("grad_values"));
  m.def(
      "local_denominators",
      [](const objective_handle& h, const at::Tensor& logp, const at::Tensor& mask, const py::kwargs& kw) {
        return local_denominators(h, tensors_from(logp, mask, kw));
      },
      py::arg("objective"), py::arg("logp"), py::arg("mask"));
}
