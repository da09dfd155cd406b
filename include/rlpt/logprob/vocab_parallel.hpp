// SPDX-License-Identifier: Apache-2.0
//! @file
//! Logprob/entropy when the vocabulary is split across tensor-parallel ranks, without ever
//! gathering the logits.
//!
//! Each rank reads its own [N, V_local] logits once and produces the online log-sum-exp state of
//! its columns plus the target logit if it owns the target. Two all-reduces over the caller's
//! communication buffer combine them: MAX over N floats, then SUM over 3N floats (each rank first
//! rebases its sums onto the global max, O(N) work, no second read of the logits). The
//! backward needs no communication: every rank writes −p·(…) for its columns from the global
//! lse and entropy, and only the owner of the target adds the one-hot (a plain all-reduce
//! without this analytic backward gives non-owner ranks a wrong gradient, ms-swift #9947).
//!
//! The reduction is a hook the caller provides, `void(view<float> data, reduce_op op)`,
//! reducing `data` in place across the group (torch.distributed, MPI, NCCL on pinned memory,
//! or the device version with an NCCL communicator: <rlpt/cuda/logprob/vocab_parallel.cuh>).
//! Truncated sampling (top-k/top-p) needs the whole row and is not available here.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/logprob/detail/row_kernels.hpp>
#include <rlpt/logprob/from_logits.hpp>
#include <rlpt/logprob/math.hpp>
#include <rlpt/logprob/options.hpp>

#include <cstdint>

RLPT_NAMESPACE_BEGIN

//! The collective a vocab-parallel step asks for.
enum class reduce_op : std::uint8_t { max, sum };

//! Which columns of the global vocabulary this rank holds: [begin, begin + local columns).
struct vocab_shard {
  index_t begin = 0; //!< first global column of this rank's logits
  index_t vocab = 0; //!< global vocabulary size V (all shards together)
};

//! Floats the caller's communication buffer needs for N rows: [max | sum | ent | target].
[[nodiscard]] constexpr index_t vocab_parallel_buffer_size(index_t rows) noexcept { return 4 * rows; }

namespace detail {

inline void check_shard(vocab_shard shard, index_t local_cols) {
  RLPT_CHECK(shard.vocab > 0 && shard.begin >= 0 && shard.begin + local_cols <= shard.vocab, errors::logprob::bad_shard,
             "shard [{}, {}) does not fit a global vocabulary of {} columns (begin {} + {} local columns)", shard.begin,
             shard.begin + local_cols, shard.vocab, shard.begin, local_cols);
}

//! A target no shard holds: outside [0, V) and not ignore_index. Device ranks cannot raise, so
//! each writes NaN into the row's target slot (all ranks see the same target and V: the SUM is
//! NaN) and the finish counts the row; host ranks raise first (check_target).
RLPT_HD_FORCEINLINE bool vocab_target_invalid(index_t target, index_t vocab, index_t ignore_index) {
  return target != ignore_index && (target < 0 || target >= vocab);
}

//! The device finish of one row from its all-reduced state and target slot, with the counter it
//! adds to (−1: none; 0: unusable row; 1: target out of range; 2: target logit −inf).
struct vocab_row {
  row_result res;
  float logp;
  bool scored;
  int counter;
};

RLPT_HD_FORCEINLINE vocab_row vocab_parallel_row(lse_state st, float zt, bool has_target) {
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  vocab_row v{{nan, nan}, 0.0f, false, -1};
  if (!lse_ok(st)) {
    v.counter = 0;
    if (has_target) v.logp = nan;
    return v;
  }
  v.res = lse_finish(st);
  if (!has_target) return v;
  v.logp = lse_logp(zt, st);
  if (zt != zt) {
    v.counter = 1; // the slot is NaN only when no shard holds the target
  } else if (v.logp == -std::numeric_limits<float>::infinity()) {
    v.counter = 2; // logit −inf: probability 0
  } else {
    v.scored = true;
  }
  return v;
}

[[noreturn]] inline void fail_nonfinite_combined(index_t row, float max_z) {
  RLPT_FAIL(errors::logprob::nonfinite,
            "logits row {} has no usable softmax over the combined shards (combined max after temperature: {}): a "
            "shard holds NaN or +inf in it (the rank whose local max is NaN or +inf; its local stage does not raise, "
            "so that no rank is left waiting in a collective), or every logit of the row is -inf",
            row, max_z);
}

inline void check_vocab_parallel_common(index_t rows, view<const index_t> targets, view<float> comm, index_t vocab,
                                        const logprob_options& opt) {
  check_logprob_options(opt);
  RLPT_CHECK(!opt.truncated(), errors::logprob::unsupported,
             "top-k/top-p/min-p (top_k {}, top_p {}, min_p {}) needs whole rows; vocab-parallel scoring supports "
             "temperature only",
             opt.top_k, opt.top_p, opt.min_p);
  expect_size("targets", targets.size(), rows, "one per logits row");
  expect_size("comm", comm.size(), vocab_parallel_buffer_size(rows), "4 floats per row: max, sum, ent, target");
  for (index_t r = 0; r < rows; ++r) check_target(r, targets[r], vocab, opt.ignore_index);
}

} // namespace detail

//! Stage 1: this rank's statistics. Writes comm = [local max | Σexp | Σexp·shift | target
//! logit or 0] and the local maxima into `local_max` ([N], kept until stage 2).
template <logit_type T>
void vocab_parallel_local(view2d<T> logits_local, view<const index_t> targets, vocab_shard shard, view<float> comm,
                          view<float> local_max, const logprob_options& opt = {}, const host_executor& ex = {}) {
  detail::check_logits(logits_local, "local logits");
  detail::check_shard(shard, logits_local.cols());
  const index_t n = logits_local.rows(), cols = logits_local.cols();
  detail::check_vocab_parallel_common(n, targets, comm, shard.vocab, opt);
  detail::expect_size("local_max", local_max.size(), n, "one per row");
  const float t = opt.temperature;
  ex.parallel_for(n, detail::row_grain(cols), [&](index_t r0, index_t r1) {
    for (index_t r = r0; r < r1; ++r) {
      const auto* x = logits_local.data() + r * logits_local.row_stride();
      const lse_state st = detail::row_accumulate(x, cols, t);
      const index_t y = targets[r] - shard.begin;
      comm[r] = st.m;
      comm[n + r] = st.s;
      comm[2 * n + r] = st.a;
      comm[3 * n + r] = targets[r] != opt.ignore_index && y >= 0 && y < cols ? detail::load_logit(x[y]) / t : 0.0f;
      local_max[r] = st.m;
    }
  });
}

//! Stage 2, after the MAX all-reduce of comm[0, N): rebases this rank's sums onto the global
//! max (O(N), no logits read).
inline void vocab_parallel_rebase(view<float> comm, view<const float> local_max) {
  const index_t n = local_max.size();
  detail::expect_size("comm", comm.size(), vocab_parallel_buffer_size(n), "4 floats per row");
  for (index_t r = 0; r < n; ++r) {
    const lse_state st = lse_rebase({local_max[r], comm[n + r], comm[2 * n + r]}, comm[r]);
    comm[n + r] = st.s;
    comm[2 * n + r] = st.a;
  }
}

//! Stage 3, after the SUM all-reduce of comm[N, 4N): the global logp, entropy and lse (every
//! rank gets the same). Rows whose combined softmax is unusable (NaN, +inf, all −inf on every
//! rank) raise on every rank alike, after the collectives, so no rank is left waiting.
inline logprob_stats vocab_parallel_finish(view<const float> comm, view<const index_t> targets,
                                           const logprob_outputs& out, const logprob_options& opt = {}) {
  const index_t n = targets.size();
  detail::expect_size("comm", comm.size(), vocab_parallel_buffer_size(n), "4 floats per row");
  detail::expect_size("logp", out.logp.size(), n, "one per row");
  detail::expect_size_or_empty("entropy", out.entropy.size(), n, "one per row");
  detail::expect_size_or_empty("saved.lse", out.saved.lse.size(), n, "one per row");
  detail::expect_size_or_empty("scored", out.scored.size(), n, "one per row");
  logprob_stats stats;
  for (index_t r = 0; r < n; ++r) {
    const lse_state st{comm[r], comm[n + r], comm[2 * n + r]};
    if (!lse_ok(st)) detail::fail_nonfinite_combined(r, st.m);
    const row_result res = lse_finish(st);
    float logp = 0.0f;
    bool scored = false;
    if (targets[r] != opt.ignore_index) {
      const float zt = comm[3 * n + r];
      if (zt == -std::numeric_limits<float>::infinity()) {
        RLPT_CHECK(opt.on_dropped != dropped_target::raise, errors::logprob::dropped_target,
                   "target {} of row {} has logit -inf: probability 0 (set on_dropped = neg_inf to score it as -inf)",
                   targets[r], r);
        logp = zt;
        ++stats.dropped;
      } else {
        logp = lse_logp(zt, st);
        scored = true;
        ++stats.scored;
      }
    } else {
      ++stats.ignored;
    }
    out.logp[r] = logp;
    if (!out.entropy.empty()) out.entropy[r] = res.entropy;
    if (!out.saved.lse.empty()) out.saved.lse[r] = res.lse;
    if (!out.scored.empty()) out.scored[r] = scored ? 1 : 0;
  }
  return stats;
}

//! All three stages with the caller's collective: `allreduce(view<float> data, reduce_op op)`
//! must reduce `data` in place over the tensor-parallel group. `comm` is the caller's
//! buffer of vocab_parallel_buffer_size(N) floats; out.logp doubles as the local-max scratch.
template <logit_type T, class Reduce>
logprob_stats vocab_parallel_logprob_entropy(view2d<T> logits_local, view<const index_t> targets, vocab_shard shard,
                                             view<float> comm, const logprob_outputs& out, Reduce&& allreduce,
                                             const logprob_options& opt = {}, const host_executor& ex = {}) {
  const index_t n = logits_local.rows();
  detail::expect_size("logp", out.logp.size(), n, "one per row");
  vocab_parallel_local(logits_local, targets, shard, comm, out.logp, opt, ex);
  allreduce(comm.subview(0, n), reduce_op::max);
  vocab_parallel_rebase(comm, out.logp);
  allreduce(comm.subview(n, 3 * n), reduce_op::sum);
  return vocab_parallel_finish(comm, targets, out, opt);
}

//! Backward on one rank, no communication: dlogits_local = ∂/∂logits_local from what the forward
//! wrote on every rank alike: `in.saved.lse` (the global lse, required), `in.entropy` (with
//! dentropy) and `in.logp` (required with dlogp: a target scored −inf gets no gradient on any
//! rank; the non-owners cannot see its logit). dlogits may be the local logits (in place).
template <logit_type T, grad_type G>
void vocab_parallel_backward(view2d<T> logits_local, view<const index_t> targets, vocab_shard shard,
                             const logprob_backward_inputs& in, view2d<G> dlogits_local,
                             const logprob_options& opt = {}, const host_executor& ex = {}) {
  detail::check_logits(logits_local, "local logits");
  detail::check_shard(shard, logits_local.cols());
  detail::check_logprob_options(opt);
  RLPT_CHECK(!opt.truncated(), errors::logprob::unsupported,
             "top-k/top-p/min-p needs whole rows; vocab-parallel scoring supports temperature only");
  const index_t n = logits_local.rows(), cols = logits_local.cols();
  detail::expect_size("targets", targets.size(), n, "one per logits row");
  detail::check_backward_inputs(in, n, n);
  detail::expect_size("saved.lse", in.saved.lse.size(), n, "the global lse the forward saved: one per row");
  if (!in.dlogp.empty())
    detail::expect_size("logp", in.logp.size(), n,
                        "the global logp the forward wrote, one per row (every rank must agree on which targets "
                        "get a gradient)");
  if (!in.dentropy.empty()) detail::expect_size("entropy", in.entropy.size(), n, "the global entropy: one per row");
  RLPT_CHECK(dlogits_local.rows() == n && dlogits_local.cols() == cols, errors::logprob::shape_mismatch,
             "dlogits are [{}, {}], expected [{}, {}] like the local logits", dlogits_local.rows(),
             dlogits_local.cols(), n, cols);
  detail::check_grad_alias(logits_local, dlogits_local);
  for (index_t r = 0; r < n; ++r) detail::check_target(r, targets[r], shard.vocab, opt.ignore_index);
  detail::backward_rows(
      logits_local,
      [&](index_t r) {
        const index_t y = targets[r];
        const bool scored = y != opt.ignore_index;
        const index_t local = y - shard.begin;
        return detail::row_job{true, scored, scored && local >= 0 && local < cols ? local : -1, r};
      },
      logprob_backward_inputs{in.dlogp, in.dentropy, in.logp, in.entropy, {.lse = in.saved.lse}}, dlogits_local, opt,
      ex);
}

RLPT_NAMESPACE_END
