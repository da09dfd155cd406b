// SPDX-License-Identifier: Apache-2.0
//! @file
//! Logits -> chosen-token logprob and entropy (forward) and -> dlogits (backward), on the host.
//!
//! The forward reads each logits row once (online log-sum-exp, fp32), whatever its dtype
//! (f32, f64, bf16, f16) and row stride, and writes fp32 results; it never allocates and never
//! copies the logits. The backward reads the row once more and writes dlogits (optionally over
//! the logits themselves). Per-row results are bit-identical whatever N, the row's position or
//! the thread count (see detail/row_kernels.hpp), so a trainer can match a batch-invariant
//! inference engine exactly.
//!
//!     rlpt::logprob_entropy(logits, targets, logp, entropy, {.temperature = 0.7f});
//!
//! Wrapping as an autograd function: forward(logits, targets) -> logp, entropy with
//! `saved.lse`; backward(dlogp, dentropy) -> dlogits from (logits, targets, entropy, lse).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/copy.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/logprob/detail/row_kernels.hpp>
#include <rlpt/logprob/detail/truncation.hpp>
#include <rlpt/logprob/math.hpp>
#include <rlpt/logprob/options.hpp>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

RLPT_NAMESPACE_BEGIN

//! Element types a logits view may have.
template <class T>
concept logit_type = std::is_same_v < std::remove_const_t<T>,
float > || std::is_same_v<std::remove_const_t<T>, double> || std::is_same_v<std::remove_const_t<T>, bf16> ||
    std::is_same_v<std::remove_const_t<T>, f16>;

//! Element types a gradient output may have.
template <class G>
concept grad_type = logit_type<G> && !std::is_const_v<G>;

namespace detail {

//! What one logits row contributes: `active` rows are processed; `scored` rows have a target
//! whose dlogp applies; `col` is the target's column in this row (−1: none here, e.g. another
//! vocab shard owns it); `out` indexes the per-target outputs (logp, entropy, scored).
struct row_job {
  bool active = false;
  bool scored = false;
  index_t col = -1;
  index_t out = -1;
};

//! Rows per parallel chunk: about 64K logits, independent of the thread count.
inline index_t row_grain(index_t cols) { return std::max<index_t>(1, index_t{1 << 16} / std::max<index_t>(cols, 1)); }

//! Kept-column rule of a row: everything (threshold −inf) unless truncated.
struct row_support {
  float threshold = neg_inf_f;
  index_t tie_last = 0;
};

//! Forward over every row of `logits`; `job(r)` maps a row to its target and output slot.
template <class T, class Job>
logprob_stats forward_rows(view2d<T> logits, Job&& job, const logprob_outputs& out, const logprob_options& opt,
                           const host_executor& ex) {
  using E = std::remove_const_t<T>;
  const index_t rows = logits.rows(), cols = logits.cols();
  const float t = opt.temperature;
  const bool truncated = opt.truncated();
  const truncation_rule rule = truncation_rule::of(opt);
  const auto body = [&](index_t r0, index_t r1) {
    logprob_stats st;
    for (index_t r = r0; r < r1; ++r) {
      const row_job jb = job(r);
      if (!jb.active) {
        ++st.ignored;
        if (out.kept.data() != nullptr)
          std::memset(out.kept.data() + r * out.kept.row_stride(), 0, static_cast<std::size_t>(cols));
        continue;
      }
      const E* x = logits.data() + r * logits.row_stride();
      const lse_state full = row_accumulate(x, cols, t);
      if (!lse_ok(full)) fail_nonfinite_row(r, cols, t, [x](index_t j) { return load_logit(x[j]); });
      row_support sup{neg_inf_f, cols - 1};
      lse_state kept_state = full;
      mask_t* kept_row = out.kept.data() != nullptr ? out.kept.data() + r * out.kept.row_stride() : nullptr;
      if (truncated) {
        const truncation tr = row_truncation(x, cols, t, full.m, rule);
        sup = {tr.threshold, tr.tie_last};
        kept_state = row_accumulate_kept(x, cols, t, full.m, sup.threshold, sup.tie_last, kept_row);
      } else if (kept_row != nullptr) {
        std::memset(kept_row, 1, static_cast<std::size_t>(cols));
      }
      const row_result res = lse_finish(kept_state);
      float logp = 0.0f;
      bool scored = jb.scored && jb.col >= 0;
      if (scored) {
        const float zt = load_logit(x[jb.col]) / t;
        if (kept_column(zt, jb.col, sup.threshold, sup.tie_last) && zt != neg_inf_f) {
          logp = lse_logp(zt, kept_state);
        } else {
          if (opt.on_dropped == dropped_target::raise) {
            index_t rank = 1;
            for (index_t j = 0; j < cols; ++j) rank += load_logit(x[j]) / t > zt ? 1 : 0;
            RLPT_FAIL(errors::logprob::dropped_target,
                      "target {} of row {} has probability 0 under the scored distribution (temperature {}, top_k "
                      "{}, top_p {}, min_p {}): it is rank {} of {} by logit (tempered logit {}, kept threshold {}); "
                      "set on_dropped = neg_inf to score it as -inf",
                      jb.col, r, opt.temperature, opt.top_k, opt.top_p, opt.min_p, rank, cols, zt, sup.threshold);
          }
          logp = neg_inf_f;
          scored = false;
          ++st.dropped;
        }
      }
      if (scored) {
        ++st.scored;
      } else if (!(jb.scored && jb.col >= 0)) {
        ++st.ignored;
      }
      if (jb.out >= 0) {
        out.logp[jb.out] = logp;
        if (!out.entropy.empty()) out.entropy[jb.out] = res.entropy;
        if (!out.scored.empty()) out.scored[jb.out] = scored ? 1 : 0;
      }
      if (!out.saved.lse.empty()) out.saved.lse[r] = res.lse;
      if (!out.saved.threshold.empty()) out.saved.threshold[r] = sup.threshold;
      if (!out.saved.tie_last.empty()) out.saved.tie_last[r] = sup.tie_last;
    }
    return st;
  };
  return ex.parallel_reduce(rows, row_grain(cols), logprob_stats{}, body,
                            [](logprob_stats& acc, const logprob_stats& p) { acc += p; });
}

//! Rejects a gradient output that partially overlaps the logits (exact in-place is fine). Views
//! of host or device memory alike: only their addresses are compared.
template <class Logits, class Grads> void check_grad_alias(const Logits& logits, const Grads& dlogits) {
  using T = std::remove_const_t<std::remove_pointer_t<decltype(logits.data())>>;
  using G = std::remove_const_t<std::remove_pointer_t<decltype(dlogits.data())>>;
  const auto span_of = [](const auto& v) {
    using V = std::remove_const_t<std::remove_pointer_t<decltype(v.data())>>;
    const auto* b = reinterpret_cast<const unsigned char*>(v.data());
    const index_t n = v.rows() == 0 ? 0 : (v.rows() - 1) * v.row_stride() + v.cols();
    return std::pair{b, b + n * static_cast<index_t>(sizeof(V))};
  };
  const auto [lb, le] = span_of(logits);
  const auto [gb, ge] = span_of(dlogits);
  const bool overlap = lb < ge && gb < le;
  const bool same = std::is_same_v<T, G> && lb == gb && logits.row_stride() == dlogits.row_stride();
  RLPT_CHECK(!overlap || same, errors::logprob::alias,
             "dlogits partially overlaps the logits (in-place backward needs the same pointer, row stride {} and "
             "dtype; got row stride {})",
             logits.row_stride(), dlogits.row_stride());
}

//! Backward over every row; rows with !active get zeros. `in`'s per-target views are indexed
//! like the outputs (job.out), `in.saved` like the rows. Missing statistics are recomputed from
//! the logits; with `in.logp`, whether a target gets a gradient is decided from it (the device
//! rule, detail::target_dlogp), otherwise from the logits as the forward did.
template <class T, class G, class Job>
void backward_rows(view2d<T> logits, Job&& job, const logprob_backward_inputs& in, view2d<G> dlogits,
                   const logprob_options& opt, const host_executor& ex) {
  using E = std::remove_const_t<T>;
  const index_t cols = logits.cols();
  const float t = opt.temperature;
  const bool truncated = opt.truncated();
  const truncation_rule rule = truncation_rule::of(opt);
  const logprob_saved_view& saved = in.saved;
  const bool have_lse = !saved.lse.empty() && (!truncated || (!saved.threshold.empty() && !saved.tie_last.empty()));
  const bool need_entropy = !in.dentropy.empty();
  // dlogits is often just allocated (torch.empty, the runners' new[]): its pages are mapped 4 MiB
  // of rows at a time, ahead of the rows that write them, one call per window instead of a fault
  // per page (core/copy.hpp). Rows with gaps between them are left to fault: the gaps are not ours.
  const bool contiguous = dlogits.row_stride() == cols;
  const index_t window = std::max<index_t>(1, index_t{4 << 20} / std::max<index_t>(1, cols * index_t{sizeof(G)}));
  if (contiguous) advise_huge_pages(dlogits.data(), static_cast<std::size_t>(logits.rows() * cols) * sizeof(G));
  ex.parallel_for(logits.rows(), row_grain(cols), [&](index_t r0, index_t r1) {
    for (index_t r = r0; r < r1; ++r) {
      G* dx = dlogits.data() + r * dlogits.row_stride();
      if (contiguous && r % window == 0) // windows of whole rows from row 0, whichever chunk reaches them
        prefault_for_write(dx, static_cast<std::size_t>(std::min(window, logits.rows() - r) * cols) * sizeof(G));
      const row_job jb = job(r);
      float glp0 = jb.active && jb.scored && !in.dlogp.empty() ? in.dlogp[jb.out] : 0.0f;
      if (!in.logp.empty()) glp0 = target_dlogp(glp0, in.logp[jb.out]);
      const float gh = jb.active && need_entropy ? in.dentropy[jb.out] : 0.0f;
      if (!jb.active || (glp0 == 0.0f && gh == 0.0f)) {
        for (index_t j = 0; j < cols; ++j) dx[j] = store_grad<G>(0.0f);
        continue;
      }
      const E* x = logits.data() + r * logits.row_stride();
      row_support sup{neg_inf_f, cols - 1};
      float lse = 0.0f, h = 0.0f;
      if (have_lse) {
        lse = saved.lse[r];
        if (truncated) sup = {saved.threshold[r], saved.tie_last[r]};
      }
      if (!have_lse || (need_entropy && in.entropy.empty())) {
        const lse_state full = row_accumulate(x, cols, t);
        if (!lse_ok(full)) fail_nonfinite_row(r, cols, t, [x](index_t j) { return load_logit(x[j]); });
        lse_state ks = full;
        if (truncated) {
          const truncation tr = row_truncation(x, cols, t, full.m, rule);
          sup = {tr.threshold, tr.tie_last};
          ks = row_accumulate_kept(x, cols, t, full.m, sup.threshold, sup.tie_last, nullptr);
        }
        const row_result res = lse_finish(ks);
        lse = res.lse;
        h = res.entropy;
      }
      if (need_entropy && !in.entropy.empty()) h = in.entropy[jb.out];
      float glp = glp0;
      index_t target = -1;
      if (glp0 != 0.0f && jb.col >= 0) {
        if (!in.logp.empty()) {
          target = jb.col; // the forward's logp decided: glp0 is 0 for a dropped target
        } else {
          const float zt = load_logit(x[jb.col]) / t; // read before the row is written (in place)
          if (kept_column(zt, jb.col, sup.threshold, sup.tie_last) && zt != neg_inf_f) {
            target = jb.col;
          } else {
            glp = 0.0f; // dropped target: its logp was -inf, it has no gradient
          }
        }
      }
      if (truncated) {
        row_backward<E, G, true>(x, dx, cols, t, lse, h, glp, gh, sup.threshold, sup.tie_last, target);
      } else {
        row_backward<E, G, false>(x, dx, cols, t, lse, h, glp, gh, sup.threshold, sup.tie_last, target);
      }
    }
  });
}

template <class T> void check_logits(view2d<T> logits, std::string_view what = "logits") {
  check_logits_shape(logits.rows(), logits.cols(), logits.row_stride(), logits.data() != nullptr, what);
}

//! Validates a backward's per-target inputs (n_out values each) and saved statistics (rows).
inline void check_backward_inputs(const logprob_backward_inputs& in, index_t n_out, index_t rows) {
  expect_size_or_empty("dlogp", in.dlogp.size(), n_out, "one per row");
  expect_size_or_empty("dentropy", in.dentropy.size(), n_out, "one per row");
  expect_size_or_empty("logp", in.logp.size(), n_out, "the forward's logp: one per row");
  expect_size_or_empty("entropy", in.entropy.size(), n_out, "the forward's entropy: one per row");
  expect_size_or_empty("saved.lse", in.saved.lse.size(), rows, "one per logits row");
  expect_size_or_empty("saved.threshold", in.saved.threshold.size(), rows, "one per logits row");
  expect_size_or_empty("saved.tie_last", in.saved.tie_last.size(), rows, "one per logits row");
}

} // namespace detail

//! Forward: logp[r] = log softmax(logits[r] / T)[targets[r]] under the (optionally truncated)
//! distribution, entropy[r] its entropy, plus saved statistics and the kept mask when asked.
//! Targets equal to opt.ignore_index get logp 0 (entropy still computed). Throws on T <= 0,
//! targets outside [0, V), sizes that disagree, rows with NaN/+inf (or all −inf).
template <logit_type T>
logprob_stats logprob_entropy(view2d<T> logits, view<const index_t> targets, const logprob_outputs& out,
                              const logprob_options& opt = {}, const host_executor& ex = {}) {
  detail::check_logprob_options(opt);
  detail::check_logits(logits);
  const index_t n = logits.rows(), v = logits.cols();
  detail::expect_size("targets", targets.size(), n, "one per logits row");
  detail::check_outputs(out, n, v, opt.truncated());
  for (index_t r = 0; r < n; ++r) detail::check_target(r, targets[r], v, opt.ignore_index);
  return detail::forward_rows(
      logits,
      [&](index_t r) {
        const index_t t = targets[r];
        const bool has = t != opt.ignore_index;
        return detail::row_job{true, has, has ? t : -1, r};
      },
      out, opt, ex);
}

//! The common case: logp and entropy only.
template <logit_type T>
logprob_stats logprob_entropy(view2d<T> logits, view<const index_t> targets, view<float> logp, view<float> entropy,
                              const logprob_options& opt = {}, const host_executor& ex = {}) {
  return logprob_entropy(logits, targets, logprob_outputs{.logp = logp, .entropy = entropy}, opt, ex);
}

//! Backward: dlogits[r, j] = ∂(Σ dlogp·logp + dentropy·entropy)/∂logits[r, j], from the
//! upstream gradients and what the forward wrote (logprob_backward_inputs: `dentropy` may be
//! empty, `entropy` goes with it, `saved` avoids a second read of the row, `logp` decides which
//! targets get a gradient; whatever is missing is recomputed). dlogits may be the logits
//! themselves (same pointer, stride and dtype: in-place); it is fully written.
template <logit_type T, grad_type G>
void logprob_entropy_backward(view2d<T> logits, view<const index_t> targets, const logprob_backward_inputs& in,
                              view2d<G> dlogits, const logprob_options& opt = {}, const host_executor& ex = {}) {
  detail::check_logprob_options(opt);
  detail::check_logits(logits);
  const index_t n = logits.rows(), v = logits.cols();
  detail::expect_size("targets", targets.size(), n, "one per logits row");
  detail::check_backward_inputs(in, n, n);
  RLPT_CHECK(dlogits.rows() == n && dlogits.cols() == v, errors::logprob::shape_mismatch,
             "dlogits are [{}, {}], expected [{}, {}] like the logits", dlogits.rows(), dlogits.cols(), n, v);
  detail::check_grad_alias(logits, dlogits);
  for (index_t r = 0; r < n; ++r) detail::check_target(r, targets[r], v, opt.ignore_index);
  detail::backward_rows(
      logits,
      [&](index_t r) {
        const index_t t = targets[r];
        const bool has = t != opt.ignore_index;
        return detail::row_job{true, has, has ? t : -1, r};
      },
      in, dlogits, opt, ex);
}

RLPT_NAMESPACE_END
