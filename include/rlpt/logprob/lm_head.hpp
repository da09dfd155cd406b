// SPDX-License-Identifier: Apache-2.0
//! @file
//! Fused lm-head: hidden [N, D] × weight [V, D]ᵀ -> chosen-token logprob and entropy without
//! ever storing the [N, V] logits (host, Eigen GEMM on fp32 tiles).
//!
//! Forward: tokens are cut into fixed tiles of `token_tile` rows (the last one zero-padded) and
//! the vocabulary into slabs of `vocab_tile` columns; each tile × slab product is accumulated
//! in fp32 (bf16 inputs are widened, never rounded to bf16 on the way: the matmul accumulation
//! is what needs fp32, torchtitan #3667) and folded into an online log-sum-exp per token.
//! Every GEMM has the same shape whatever N is, so a token's result is bit-identical whatever
//! the batch (the row kernels add the same guarantee for the softmax part).
//!
//! Backward: per vocabulary slab, the logits tiles are recomputed, turned into dlogits
//! (fp32, a slab of N × vocab_tile), then grad_hidden += dlogits · W_slab and
//! grad_weight[slab] = dlogitsᵀ · hidden. 8·N·D·V FLOPs in all, like every recompute scheme.
//!
//! Extra memory: forward, per worker, token_tile·(D + vocab_tile) + vocab_tile·D floats;
//! backward, N·vocab_tile + vocab_tile·D floats plus the per-worker tiles. Independent of V.
//!
//! The one host header that needs Eigen, so no umbrella includes it: include it by name and link
//! rlpt::lm_head (`find_package(rlpt COMPONENTS lm_head)`), or put Eigen 3.4 on the include path.
#pragma once

#if !__has_include(<Eigen/Core>) // name the component, not only "no such file"
// Fix: find_package(rlpt COMPONENTS lm_head) and link rlpt::lm_head, or add -I /usr/include/eigen3.
#error "<rlpt/logprob/lm_head.hpp> needs Eigen 3.4: link rlpt::lm_head or add Eigen's include directory"
#endif

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/executor.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/logprob/detail/row_kernels.hpp>
#include <rlpt/logprob/from_logits.hpp>
#include <rlpt/logprob/math.hpp>
#include <rlpt/logprob/options.hpp>
#include <rlpt/logprob/vocab_parallel.hpp>

#include <Eigen/Core>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

RLPT_NAMESPACE_BEGIN

struct lm_head_options {
  //! logits = hidden · weightᵀ / T (verl's linear_cross_entropy and Liger's fused scaled CE
  //! take the same temperature).
  float temperature = 1.0f;
  //! Targets equal to this are not scored (torch cross_entropy: −100).
  index_t ignore_index = -100;
  //! Rows per GEMM tile, rounded up to a multiple of 48 so every tile takes Eigen's full
  //! register-block path (what keeps results batch invariant). 192 balances GEMM efficiency
  //! against per-worker scratch.
  index_t token_tile = 192;
  //! Vocabulary columns per slab (the backward keeps N × vocab_tile fp32 dlogits).
  index_t vocab_tile = 1024;
};

namespace detail {

using mat_rm = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using map_rm = Eigen::Map<mat_rm, Eigen::Unaligned, Eigen::OuterStride<>>;
using cmap_rm = Eigen::Map<const mat_rm, Eigen::Unaligned, Eigen::OuterStride<>>;

inline index_t round_tile(index_t t) { return std::max<index_t>(48, (t + 47) / 48 * 48); }

//! Copies rows [r0, r0 + rows) × cols [c0, c0 + cols) of `src` into a dense fp32 buffer with
//! `ld` floats per row; rows past the source are zero.
template <class T>
void widen_rows(view2d<T> src, index_t r0, index_t rows, index_t c0, index_t cols, float* dst, index_t ld,
                index_t pad_rows = 0) {
  for (index_t i = 0; i < rows; ++i) {
    const auto* s = src.data() + (r0 + i) * src.row_stride() + c0;
    float* d = dst + i * ld;
    for (index_t j = 0; j < cols; ++j) d[j] = load_logit(s[j]);
  }
  for (index_t i = rows; i < rows + pad_rows; ++i) std::fill(dst + i * ld, dst + i * ld + cols, 0.0f);
}

template <class H, class W>
void check_lm_head(view2d<H> hidden, view2d<W> weight, view<const index_t> targets, const lm_head_options& o) {
  RLPT_CHECK(o.temperature > 0.0f && std::isfinite(o.temperature), errors::logprob::temperature,
             "temperature must be finite and > 0, got {}", o.temperature);
  RLPT_CHECK(o.token_tile > 0 && o.vocab_tile > 0, errors::logprob::bad_tile,
             "token_tile ({}) and vocab_tile ({}) must be positive", o.token_tile, o.vocab_tile);
  check_logits_shape(hidden.rows(), hidden.cols(), hidden.row_stride(), hidden.data() != nullptr, "hidden");
  check_logits_shape(weight.rows(), weight.cols(), weight.row_stride(), weight.data() != nullptr, "weight");
  RLPT_CHECK(hidden.cols() > 0 && hidden.cols() == weight.cols(), errors::logprob::shape_mismatch,
             "hidden is [{}, {}] and weight is [{}, {}]: both need the same positive hidden size D", hidden.rows(),
             hidden.cols(), weight.rows(), weight.cols());
  RLPT_CHECK(weight.rows() > 0, errors::logprob::shape_mismatch, "weight has 0 rows: the vocabulary is empty");
  expect_size("targets", targets.size(), hidden.rows(), "one per hidden row");
}

//! One logit hidden[r] · weight[j] in fp32 (the cold path of an error message).
template <class H, class W> float lm_head_logit(view2d<H> hidden, view2d<W> weight, index_t r, index_t j) {
  float acc = 0.0f;
  for (index_t k = 0; k < hidden.cols(); ++k)
    acc +=
        load_logit(hidden.data()[r * hidden.row_stride() + k]) * load_logit(weight.data()[j * weight.row_stride() + k]);
  return acc;
}

//! Forward core: per token tile, the online LSE state of every row over this weight's columns
//! and the target logit when the target is one of them (col_begin = global id of column 0).
//! `emit(row, state, target_logit, has_target)` receives each row once, in any order.
template <class H, class W, class Emit>
void lm_head_rows(view2d<H> hidden, view2d<W> weight, view<const index_t> targets, index_t col_begin,
                  const lm_head_options& o, const host_executor& ex, Emit&& emit) {
  const index_t n = hidden.rows(), d = hidden.cols(), v = weight.rows();
  const index_t tt = round_tile(o.token_tile), vt = std::min(o.vocab_tile, v);
  const float t = o.temperature;
  constexpr bool weight_f32 = std::is_same_v<std::remove_const_t<W>, float>;
  constexpr bool hidden_f32 = std::is_same_v<std::remove_const_t<H>, float>;
  const index_t tiles = (n + tt - 1) / tt;
  ex.parallel_for(tiles, 1, [&](index_t t0, index_t t1) {
    std::vector<float> hs(static_cast<std::size_t>(tt * d));
    std::vector<float> ws(weight_f32 ? 0 : static_cast<std::size_t>(vt * d));
    std::vector<float> logits(static_cast<std::size_t>(tt * vt));
    std::vector<lse_state> st(static_cast<std::size_t>(tt));
    std::vector<float> zt(static_cast<std::size_t>(tt));
    std::vector<char> hit(static_cast<std::size_t>(tt));
    for (index_t tile = t0; tile < t1; ++tile) {
      const index_t r0 = tile * tt, rows = std::min(tt, n - r0);
      // a full tt-row tile every time: the last one padded with zero rows
      const float* hp = hs.data();
      index_t hld = d;
      bool mapped = false;
      if constexpr (hidden_f32) {
        if (rows == tt) { // whole tile in place: no copy
          hp = hidden.data() + r0 * hidden.row_stride();
          hld = hidden.row_stride();
          mapped = true;
        }
      }
      if (!mapped) widen_rows(hidden, r0, rows, 0, d, hs.data(), d, tt - rows);
      const cmap_rm hm(hp, tt, d, Eigen::OuterStride<>(hld));
      std::fill(st.begin(), st.end(), lse_state{});
      std::fill(hit.begin(), hit.end(), char{0});
      for (index_t c0 = 0; c0 < v; c0 += vt) {
        const index_t cols = std::min(vt, v - c0);
        const float* wp = nullptr;
        index_t wld = d;
        if constexpr (weight_f32) {
          wp = weight.data() + c0 * weight.row_stride();
          wld = weight.row_stride();
        } else {
          widen_rows(weight, c0, cols, 0, d, ws.data(), d);
          wp = ws.data();
        }
        const cmap_rm wm(wp, cols, d, Eigen::OuterStride<>(wld));
        map_rm lm(logits.data(), tt, cols, Eigen::OuterStride<>(cols));
        lm.noalias() = hm * wm.transpose();
        for (index_t i = 0; i < rows; ++i) {
          const float* lr = logits.data() + i * cols;
          st[static_cast<std::size_t>(i)] = lse_merge(st[static_cast<std::size_t>(i)], row_accumulate(lr, cols, t));
          const index_t y = targets[r0 + i] - col_begin - c0;
          if (targets[r0 + i] != o.ignore_index && y >= 0 && y < cols) {
            zt[static_cast<std::size_t>(i)] = lr[y] / t;
            hit[static_cast<std::size_t>(i)] = 1;
          }
        }
      }
      for (index_t i = 0; i < rows; ++i)
        emit(r0 + i, st[static_cast<std::size_t>(i)], zt[static_cast<std::size_t>(i)],
             hit[static_cast<std::size_t>(i)] != 0);
    }
  });
}

} // namespace detail

//! Forward: logp/entropy of `targets` under softmax(hidden · weightᵀ / T), never storing the
//! logits. hidden [N, D] and weight [V, D] may be f32, bf16, f16 or f64 (widened to fp32), with
//! row strides. Writes out.logp (required), out.entropy, out.saved.lse, out.scored.
template <logit_type H, logit_type W>
logprob_stats fused_lm_head_logprob(view2d<H> hidden, view2d<W> weight, view<const index_t> targets,
                                    const logprob_outputs& out, const lm_head_options& opt = {},
                                    const host_executor& ex = {}) {
  detail::check_lm_head(hidden, weight, targets, opt);
  const index_t n = hidden.rows(), v = weight.rows();
  detail::check_outputs(out, n, v, false);
  RLPT_CHECK(out.kept.data() == nullptr && out.saved.threshold.empty() && out.saved.tie_last.empty(),
             errors::logprob::unsupported, "the fused lm-head scores the full softmax: no kept mask or truncation");
  for (index_t r = 0; r < n; ++r) detail::check_target(r, targets[r], v, opt.ignore_index);
  detail::lm_head_rows(hidden, weight, targets, 0, opt, ex, [&](index_t r, lse_state st, float zt, bool has) {
    if (!lse_ok(st))
      detail::fail_nonfinite_row(r, v, opt.temperature,
                                 [&](index_t j) { return detail::lm_head_logit(hidden, weight, r, j); });
    const row_result res = lse_finish(st);
    out.logp[r] = has ? lse_logp(zt, st) : 0.0f;
    if (!out.entropy.empty()) out.entropy[r] = res.entropy;
    if (!out.saved.lse.empty()) out.saved.lse[r] = res.lse;
    if (!out.scored.empty()) out.scored[r] = has ? 1 : 0;
  });
  logprob_stats stats;
  for (index_t r = 0; r < n; ++r) {
    if (targets[r] == opt.ignore_index) {
      ++stats.ignored;
    } else {
      ++stats.scored;
    }
  }
  return stats;
}

//! Vocab-parallel stage 1 for a fused lm-head shard: weight_local holds rows
//! [shard.begin, shard.begin + V_local) of the full head. Fills `comm` and `local_max` exactly
//! like vocab_parallel_local; continue with vocab_parallel_rebase / vocab_parallel_finish.
template <logit_type H, logit_type W>
void fused_lm_head_local(view2d<H> hidden, view2d<W> weight_local, view<const index_t> targets, vocab_shard shard,
                         view<float> comm, view<float> local_max, const lm_head_options& opt = {},
                         const host_executor& ex = {}) {
  detail::check_lm_head(hidden, weight_local, targets, opt);
  detail::check_shard(shard, weight_local.rows());
  const index_t n = hidden.rows();
  detail::check_vocab_parallel_common(n, targets, comm, shard.vocab,
                                      {.temperature = opt.temperature, .ignore_index = opt.ignore_index});
  detail::expect_size("local_max", local_max.size(), n, "one per row");
  detail::lm_head_rows(hidden, weight_local, targets, shard.begin, opt, ex,
                       [&](index_t r, lse_state st, float zt, bool has) {
                         comm[r] = st.m;
                         comm[n + r] = st.s;
                         comm[2 * n + r] = st.a;
                         comm[3 * n + r] = has ? zt : 0.0f;
                         local_max[r] = st.m;
                       });
}

//! Backward: grad_hidden (+)= ∂/∂hidden and grad_weight (+)= ∂/∂weight of
//! Σ dlogp·logp + dentropy·entropy, recomputing the logits tile by tile. Either gradient may be
//! empty (not computed). `entropy` and `lse` are the forward's outputs. With `shard` the
//! weight is a vocab-parallel shard: grad_hidden is this rank's partial sum (all-reduce it),
//! grad_weight its own rows. `accumulate` adds into the gradients instead of overwriting them.
template <logit_type H, logit_type W>
void fused_lm_head_backward(view2d<H> hidden, view2d<W> weight, view<const index_t> targets, view<const float> dlogp,
                            view<const float> dentropy, view<const float> entropy, view<const float> lse,
                            view2d<float> grad_hidden, view2d<float> grad_weight, const lm_head_options& opt = {},
                            const host_executor& ex = {}, vocab_shard shard = {}, bool accumulate = false) {
  detail::check_lm_head(hidden, weight, targets, opt);
  const index_t n = hidden.rows(), d = hidden.cols(), v = weight.rows();
  if (shard.vocab == 0) shard.vocab = v;
  detail::check_shard(shard, v);
  detail::expect_size_or_empty("dlogp", dlogp.size(), n, "one per row");
  detail::expect_size_or_empty("dentropy", dentropy.size(), n, "one per row");
  detail::expect_size("lse", lse.size(), n, "the forward's saved.lse: one per row");
  if (!dentropy.empty()) detail::expect_size("entropy", entropy.size(), n, "the forward's entropy: one per row");
  const bool want_gh = grad_hidden.data() != nullptr, want_gw = grad_weight.data() != nullptr;
  if (want_gh)
    RLPT_CHECK(grad_hidden.rows() == n && grad_hidden.cols() == d, errors::logprob::shape_mismatch,
               "grad_hidden is [{}, {}], expected [{}, {}] like hidden", grad_hidden.rows(), grad_hidden.cols(), n, d);
  if (want_gw)
    RLPT_CHECK(grad_weight.rows() == v && grad_weight.cols() == d, errors::logprob::shape_mismatch,
               "grad_weight is [{}, {}], expected [{}, {}] like weight", grad_weight.rows(), grad_weight.cols(), v, d);
  for (index_t r = 0; r < n; ++r) detail::check_target(r, targets[r], shard.vocab, opt.ignore_index);
  if (!want_gh && !want_gw) return;

  const index_t tt = detail::round_tile(opt.token_tile), vt = std::min(opt.vocab_tile, v);
  const index_t tiles = (n + tt - 1) / tt;
  const float t = opt.temperature;
  constexpr bool weight_f32 = std::is_same_v<std::remove_const_t<W>, float>;
  if (!accumulate) {
    if (want_gh)
      for (index_t r = 0; r < n; ++r) std::fill_n(grad_hidden.data() + r * grad_hidden.row_stride(), d, 0.0f);
    if (want_gw)
      for (index_t r = 0; r < v; ++r) std::fill_n(grad_weight.data() + r * grad_weight.row_stride(), d, 0.0f);
  }
  std::vector<float> ws(weight_f32 ? 0 : static_cast<std::size_t>(vt * d));
  std::vector<float> dz(static_cast<std::size_t>(tiles * tt * vt));
  const index_t dblock = 256; // grad_weight columns per task in phase 2
  for (index_t c0 = 0; c0 < v; c0 += vt) {
    const index_t cols = std::min(vt, v - c0);
    const float* wp = nullptr;
    index_t wld = d;
    if constexpr (weight_f32) {
      wp = weight.data() + c0 * weight.row_stride();
      wld = weight.row_stride();
    } else {
      ex.parallel_for(cols, 64, [&](index_t a, index_t b) {
        detail::widen_rows(weight, c0 + a, b - a, 0, d, ws.data() + a * d, d);
      });
      wp = ws.data();
    }
    const detail::cmap_rm wm(wp, cols, d, Eigen::OuterStride<>(wld));
    // phase 1: recompute logits, dlogits slab, grad_hidden rows (disjoint per tile)
    ex.parallel_for(tiles, 1, [&](index_t t0, index_t t1) {
      std::vector<float> hs(static_cast<std::size_t>(tt * d));
      std::vector<float> logits(static_cast<std::size_t>(tt * cols));
      for (index_t tile = t0; tile < t1; ++tile) {
        const index_t r0 = tile * tt, rows = std::min(tt, n - r0);
        detail::widen_rows(hidden, r0, rows, 0, d, hs.data(), d, tt - rows);
        const detail::cmap_rm hm(hs.data(), tt, d, Eigen::OuterStride<>(d));
        detail::map_rm lm(logits.data(), tt, cols, Eigen::OuterStride<>(cols));
        lm.noalias() = hm * wm.transpose();
        float* dzt = dz.data() + r0 * cols;
        for (index_t i = 0; i < tt; ++i) {
          float* drow = dzt + i * cols;
          const index_t r = r0 + i;
          const bool live = i < rows;
          const bool scored = live && targets[r] != opt.ignore_index && !dlogp.empty();
          const float glp = scored ? dlogp[r] : 0.0f;
          const float gh = live && !dentropy.empty() ? dentropy[r] : 0.0f;
          if (glp == 0.0f && gh == 0.0f) {
            std::fill_n(drow, cols, 0.0f);
            continue;
          }
          const index_t y = scored ? targets[r] - shard.begin - c0 : -1;
          detail::row_backward<float, float, false>(logits.data() + i * cols, drow, cols, t, lse[r],
                                                    gh != 0.0f ? entropy[r] : 0.0f, glp, gh, 0.0f, 0,
                                                    y >= 0 && y < cols ? y : -1);
        }
        if (want_gh) {
          detail::map_rm gm(grad_hidden.data() + r0 * grad_hidden.row_stride(), rows, d,
                            Eigen::OuterStride<>(grad_hidden.row_stride()));
          const detail::cmap_rm dm(dzt, rows, cols, Eigen::OuterStride<>(cols));
          gm.noalias() += dm * wm;
        }
      }
    });
    if (!want_gw) continue;
    // phase 2: grad_weight[slab] += dlogitsᵀ · hidden, split over hidden columns (disjoint)
    ex.parallel_for(d, dblock, [&](index_t d0, index_t d1) {
      const index_t dc = d1 - d0;
      std::vector<float> hs(static_cast<std::size_t>(tt * dc));
      detail::map_rm gw(grad_weight.data() + c0 * grad_weight.row_stride() + d0, cols, dc,
                        Eigen::OuterStride<>(grad_weight.row_stride()));
      for (index_t tile = 0; tile < tiles; ++tile) {
        const index_t r0 = tile * tt, rows = std::min(tt, n - r0);
        detail::widen_rows(hidden, r0, rows, d0, dc, hs.data(), dc);
        const detail::cmap_rm hm(hs.data(), rows, dc, Eigen::OuterStride<>(dc));
        const detail::cmap_rm dm(dz.data() + r0 * cols, rows, cols, Eigen::OuterStride<>(cols));
        gw.noalias() += dm.transpose() * hm;
      }
    });
  }
}

RLPT_NAMESPACE_END
