// SPDX-License-Identifier: Apache-2.0
//! @file
//! The host driver of the token pass (detail/token.hpp): rows go through in chunks of 256 tokens
//! that stay in L1, each stage a tight loop the compiler vectorises, compiled once per instruction
//! set out of line and chosen at run time. Sums are accumulated in fp64 over fixed lanes, so the
//! result does not depend on how rows are split across threads.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/cpu.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/objective/detail/plan.hpp>
#include <rlpt/objective/detail/token.hpp>
#include <rlpt/objective/inputs.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN
namespace detail {

inline constexpr int host_chunk = 256;

template <class T> using host_chunk_data = token_chunk<T, host_chunk>;

// Host-only force-inline (RLPT_HD_FORCEINLINE would make the row body host+device under nvcc):
// the row driver must inline into each ISA clone below.
#if defined(__GNUC__) || defined(__clang__)
#define RLPT_OBJECTIVE_HOST_INLINE inline __attribute__((always_inline))
#else
#define RLPT_OBJECTIVE_HOST_INLINE inline
#endif

// x86-64 builds default to SSE2. The token pass is compute-bound (two exp per token), so an
// AVX2+FMA clone roughly halves its time; it is chosen at run time when the CPU has both. Every
// clone gives the bits of the default build: the exp's multiply-adds are explicit std::fma calls
// (an FMA instruction in the clones, fmaf in the default build), and no other a * b + c is
// contracted (GCC: optimize("fp-contract=off") on every stage, RLPT_HOST_LOOP_ATTR; clang:
// RLPT_NO_CONTRACT_BEGIN around the objective's headers).
#if RLPT_ISA_DISPATCH() && !defined(__AVX2__)
#define RLPT_OBJECTIVE_AVX2_CLONE() 1
#else
#define RLPT_OBJECTIVE_AVX2_CLONE() 0
#endif

// An AVX-512 clone as well where the compiler is GCC (host code), whose target attribute can ask
// for 512-bit vectorisation (prefer-vector-width=512). 1.6x the AVX2 clone on the objective bench
// (docs/performance.md).
#if RLPT_OBJECTIVE_AVX2_CLONE() && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define RLPT_OBJECTIVE_AVX512_CLONE() 1
#else
#define RLPT_OBJECTIVE_AVX512_CLONE() 0
#endif

// Each chunk stage is compiled once per instruction set as its own out-of-line function (a call
// per 256 tokens costs nothing). Force-inlining all of them into one row function per ISA made
// two functions of ~200 KB of machine code, and GCC's -O3 passes that grow faster than linearly
// with function size (PRE, post-reload CSE, liveness) took over a minute in every TU calling
// evaluate. The chunk is a local of the row driver, so __restrict tells the truth: nothing else
// the stage reads (plan, inputs, outputs) overlaps it. Running sums go in and come back by value:
// passed by reference, g++ 12 -O3 lost the AVX2 stats stage's update of row_stats::sum_logw in
// its caller (GMPO with token weights; gone with -fno-ipa-modref).
#if defined(__GNUC__) || defined(__clang__)
#define RLPT_OBJECTIVE_STAGE_NOINLINE __attribute__((noinline))
#define RLPT_OBJECTIVE_RESTRICT __restrict__
#else
#define RLPT_OBJECTIVE_STAGE_NOINLINE
#define RLPT_OBJECTIVE_RESTRICT
#endif

//! The slots a host stage computes for n tokens: n rounded up to a multiple of 16. Every stage
//! loop's trip count is then a multiple of each clone's vector width (16 floats in AVX-512), which
//! GCC sees from the count's low bits and compiles no remainder loop for: a TU calling evaluate
//! took a fifth less time and code (docs/performance.md, "Compile time"). The slots past n hold
//! invalid tokens: load clears their valid flags, and their values are zeros (the chunk starts
//! zeroed) or an earlier chunk's, never indeterminate. Every sum, count and maximum selects on the
//! valid or in-loss flags, so they add nothing (a selected +0 leaves a lane that starts at +0
//! unchanged), and gradients are stored for the first n only.
RLPT_OBJECTIVE_HOST_INLINE int host_lanes(int n) { return (n + 15) & ~15; }
static_assert(host_chunk % 16 == 0, "host_lanes must not pass the chunk");

//! The per-row sums' count type on the host.
using host_count = std::int64_t;

// NOLINTBEGIN(bugprone-macro-parentheses): ATTR is a function attribute, which parentheses would break
#define RLPT_OBJECTIVE_HOST_STAGES(ATTR, WIDE)                                                                         \
  ATTR static int load(const objective_plan& p, const basic_objective_inputs<T>& in, index_t b, index_t i0, int n,     \
                       host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c, bool row = false) {                              \
    const int bad = load_chunk(p, in, b, i0, n, c, row);                                                               \
    std::memset(c.valid + n, 0, static_cast<std::size_t>(host_lanes(n) - n));                                          \
    return bad;                                                                                                        \
  }                                                                                                                    \
  /* A rejection criterion's statistics (rs_stat_chunk), for correction and stats: one copy per clone. */              \
  ATTR static void rs_stats(const objective_plan& p, rs_stat s, int n, host_chunk_data<T>& c) {                        \
    rs_stat_chunk(p, s, n, c);                                                                                         \
  }                                                                                                                    \
  ATTR static void correction(const objective_plan& p, const token_consts<T>& k, int n,                                \
                              host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c) {                                         \
    correction_chunk(p, k, host_lanes(n), c, host_rs_stats{});                                                         \
  }                                                                                                                    \
  ATTR static row_stats stats(const objective_plan& p, int n, host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c,           \
                              row_stats st) {                                                                          \
    stats_chunk<WIDE>(p, host_lanes(n), c, st, host_rs_stats{});                                                       \
    return st;                                                                                                         \
  }                                                                                                                    \
  struct host_rs_stats {                                                                                               \
    RLPT_OBJECTIVE_HOST_INLINE void operator()(const objective_plan& p, rs_stat s, int n,                              \
                                               host_chunk_data<T>& c) const {                                          \
      rs_stats(p, s, n, c);                                                                                            \
    }                                                                                                                  \
  };                                                                                                                   \
  ATTR static void policy(const objective_plan& p, const token_consts<T>& k, int n,                                    \
                          host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c) {                                             \
    policy_chunk(p, k, host_lanes(n), c);                                                                              \
  }                                                                                                                    \
  ATTR static void kl(const objective_plan& p, int n, host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c) {                 \
    kl_chunk(p, host_lanes(n), c);                                                                                     \
  }                                                                                                                    \
  ATTR static token_acc<double, host_count> combine(const objective_plan& p, const token_consts<T>& k, index_t i0,     \
                                                    int n, host_chunk_data<T>& RLPT_OBJECTIVE_RESTRICT c,              \
                                                    const basic_objective_grads<T>& gr,                                \
                                                    token_acc<double, host_count> a) {                                 \
    combine_chunk<WIDE>(p, k, i0, host_lanes(n), n, c, gr, a);                                                         \
    return a;                                                                                                          \
  }
// NOLINTEND(bugprone-macro-parentheses)

// Where the AVX2 and AVX-512 clones exist (x86-64 builds for the SSE2 baseline, GCC), the default
// clone runs only on CPUs without AVX2 and FMA (before 2013): it is compiled at -O1, not
// vectorised, which takes an eighth off the compile time of every TU calling evaluate
// (docs/performance.md, "Compile time"; the clones give the same bits at every level). Where it is
// the only clone (ARM, clang, RLPT_NO_ISA_DISPATCH, a baseline with AVX2) it keeps the loop
// attributes.
#if RLPT_OBJECTIVE_AVX512_CLONE()
#define RLPT_OBJECTIVE_DEFAULT_ATTR optimize("O1", "fp-contract=off")
#else
#define RLPT_OBJECTIVE_DEFAULT_ATTR RLPT_HOST_LOOP_ATTR
#endif

//! The chunk stages for the default instruction set.
template <class T> struct host_stages_default {
  RLPT_OBJECTIVE_HOST_STAGES(RLPT_OBJECTIVE_STAGE_NOINLINE __attribute__((RLPT_OBJECTIVE_DEFAULT_ATTR)), false)
};

#if RLPT_OBJECTIVE_AVX2_CLONE()
#define RLPT_OBJECTIVE_AVX2_ATTR target("avx2,fma"), RLPT_HOST_LOOP_ATTR
//! The chunk stages compiled for AVX2 + FMA (chosen at run time).
template <class T> struct host_stages_avx2 {
  RLPT_OBJECTIVE_HOST_STAGES(__attribute__((noinline, RLPT_OBJECTIVE_AVX2_ATTR)), false)
};
#endif

#if RLPT_OBJECTIVE_AVX512_CLONE()
#define RLPT_OBJECTIVE_AVX512_ATTR                                                                                     \
  target("avx512f,avx512vl,avx512bw,avx512dq,prefer-vector-width=512"), RLPT_HOST_LOOP_ATTR
//! The chunk stages compiled for AVX-512 (chosen at run time).
template <class T> struct host_stages_avx512 {
  RLPT_OBJECTIVE_HOST_STAGES(__attribute__((noinline, RLPT_OBJECTIVE_AVX512_ATTR)), true)
};
#endif

#undef RLPT_OBJECTIVE_HOST_STAGES

//! The part of tokens [i0, i0 + n) that holds their valid tokens, [lo, hi) counted from i0:
//! from the first valid token to the last, widened to whole groups of eight from i0. A padded
//! row's tail (and a masked head) then costs a scan of its mask bytes and the zeroing of its
//! gradient slots instead of every stage; the tokens left out are invalid and add nothing, and
//! the widening keeps each kept token in the chunk_sums lane (j % 8) it had, so every sum is
//! the one the whole chunk gives.
struct chunk_span {
  int lo = 0, hi = 0;
};

template <class T>
RLPT_OBJECTIVE_HOST_INLINE chunk_span valid_span(const basic_objective_inputs<T>& in, index_t i0, int n) {
  if (in.mask.size() == 0) return {0, n}; // no mask: every slot is valid
  const mask_t* m = in.mask.data() + i0;
  const auto lo = static_cast<int>(first_valid(m, n));
  if (lo == n) return {0, 0};
  const auto hi = static_cast<int>(end_of_valid(m, n));
  return {lo & ~7, std::min(n, (hi + 7) & ~7)};
}

//! Zeroes the gradient slots of tokens [i0, i0 + n) (what combine_chunk writes for tokens
//! outside the loss).
template <class T> RLPT_OBJECTIVE_HOST_INLINE void zero_grads(const basic_objective_grads<T>& gr, index_t i0, int n) {
  if (n <= 0) return;
  const auto count = static_cast<std::size_t>(n);
  if (gr.logp.size() != 0) std::fill_n(gr.logp.data() + i0, count, T(0));
  if (gr.entropy.size() != 0) std::fill_n(gr.entropy.data() + i0, count, T(0));
  if (gr.values.size() != 0) std::fill_n(gr.values.data() + i0, count, T(0));
}

//! Row b in chunks of host_chunk tokens: pass(i0, n) over each chunk's valid_span, skip(i0, n)
//! over the slots before and after it (the whole chunk when it has no valid token).
template <class T, class Pass, class Skip>
RLPT_OBJECTIVE_HOST_INLINE void for_valid_chunks(const basic_objective_inputs<T>& in, index_t b, Pass&& pass,
                                                 Skip&& skip) {
  const index_t base = in.layout.begin(b);
  const index_t len = in.layout.length(b);
  for (index_t t0 = 0; t0 < len; t0 += host_chunk) {
    const index_t i0 = base + t0;
    const int n = static_cast<int>(std::min<index_t>(host_chunk, len - t0));
    const chunk_span s = valid_span(in, i0, n);
    skip(i0, s.lo);
    skip(i0 + s.hi, n - s.hi);
    if (s.hi > s.lo) pass(i0 + s.lo, s.hi - s.lo);
  }
}

//! The row statistics of sequence b, chunk by chunk with the stages S (`c` zeroed once, host_rows_body).
template <class T, class S>
row_stats host_row_stats_with(const objective_plan& p, const basic_objective_inputs<T>& in, index_t b,
                              host_chunk_data<T>& c) {
  row_stats st;
  for_valid_chunks(
      in, b, [&](index_t i0, int n) RLPT_INLINE_LAMBDA { st = row_stats_pass<S>(p, in, b, i0, n, c, st); },
      [](index_t, int) RLPT_INLINE_LAMBDA {});
  return st;
}

//! The row statistics of one sequence with this CPU's stages (count_local; `c` zeroed once), the
//! functions the rows kernels call. With the default stages, which count_local took before, a
//! call that counts its own denominators (token rejection that removes tokens, nonfinite::mask,
//! batch-normalised weights) ran that pass in SSE2 with a libm call per std::fma: three quarters
//! of a call with token rejection.
template <class T> auto host_row_stats_kernel() noexcept {
#if RLPT_OBJECTIVE_AVX512_CLONE()
  if (cpu_has_avx512()) return &host_row_stats_with<T, host_stages_avx512<T>>;
#endif
#if RLPT_OBJECTIVE_AVX2_CLONE()
  if (cpu_has_avx2_fma()) return &host_row_stats_with<T, host_stages_avx2<T>>;
#endif
  return &host_row_stats_with<T, host_stages_default<T>>;
}

//! Evaluates one sequence with the chunk stages S: writes its gradients and returns its sums.
//! `st`: the row's statistics when count_local kept them (else null: computed here).
//! `c` is zeroed once and reused across rows (zeroing the absent inputs' arrays once
//! per row was a few percent of a call on rows of a few hundred tokens). The sequence form (GSPO, SAPO)
//! adds its coupling once the row's token pass is done: the pass keeps its chunks' in-loss flags
//! in `inl` (one byte per token of the row), so that the coupling does not load and correct the
//! row a third time (the device's coupling_pass does, one token per thread).
template <class T, class S>
RLPT_OBJECTIVE_HOST_INLINE objective_sums host_row_body(const objective_plan& p, const basic_objective_inputs<T>& in,
                                                        const basic_objective_grads<T>& gr, const row_stats* st,
                                                        index_t b, host_chunk_data<T>& c,
                                                        std::vector<std::uint8_t>& inl) {
  row_consts rc;
  if (p.need_row_pass) {
    rc = row_finish(p, st != nullptr ? *st : host_row_stats_with<T, S>(p, in, b, c));
  } else {
    rc.len_loss = 1.0; // no term of this plan depends on the length; rows without tokens add nothing
  }
  row_alphas(p, rc);
  const token_consts<T> k = make_token_consts<T>(p, rc);
  token_acc<double, host_count> a;
  const bool coupled = p.coupled && gr.logp.size() != 0;
  const index_t base = in.layout.begin(b);
  if (coupled && inl.size() < static_cast<std::size_t>(in.layout.length(b)))
    inl.resize(static_cast<std::size_t>(in.layout.length(b)));
  for_valid_chunks(
      in, b,
      [&](index_t i0, int n) RLPT_INLINE_LAMBDA {
        a = token_pass<S>(p, k, in, gr, b, i0, n, c, a);
        if (coupled) std::memcpy(inl.data() + (i0 - base), c.inl, static_cast<std::size_t>(n));
      },
      [&](index_t i0, int n) RLPT_INLINE_LAMBDA { zero_grads(gr, i0, n); });
  const double num = coupled && a.in_loss > 0 ? coupling_numerator(p, rc, a.dcoef, a.kl) : 0.0;
  if (num != 0.0) {
    const T scale = static_cast<T>(sequence_coupling(rc, num));
    for_valid_chunks(
        in, b,
        [&](index_t i0, int n)
            RLPT_INLINE_LAMBDA { coupling_chunk(scale, n, inl.data() + (i0 - base), gr.logp.data() + i0); },
        [](index_t, int) RLPT_INLINE_LAMBDA {});
  }
  return row_sums(p, rc, a, /*head=*/true);
}

//! Evaluates sequences [b0, b1) with the chunk stages S, merging their sums in row order.
//! `stats`: every row's statistics, indexed by sequence, when count_local kept them (else null).
template <class T, class S>
RLPT_OBJECTIVE_HOST_INLINE objective_sums host_rows_body(const objective_plan& p, const basic_objective_inputs<T>& in,
                                                         const basic_objective_grads<T>& gr, const row_stats* stats,
                                                         index_t b0, index_t b1) {
  host_chunk_data<T> c{};        // zeroed: absent inputs and the padded slots (host_lanes) read as 0
  std::vector<std::uint8_t> inl; // GSPO's in-loss flags of a row (host_row_body)
  objective_sums acc;
  for (index_t b = b0; b < b1; ++b)
    acc.merge(host_row_body<T, S>(p, in, gr, stats != nullptr ? stats + b : nullptr, b, c, inl));
  return acc;
}

template <class T>
__attribute__((RLPT_OBJECTIVE_DEFAULT_ATTR)) objective_sums
host_rows_default(const objective_plan& p, const basic_objective_inputs<T>& in, const basic_objective_grads<T>& gr,
                  const row_stats* stats, index_t b0, index_t b1) {
  return host_rows_body<T, host_stages_default<T>>(p, in, gr, stats, b0, b1);
}

#if RLPT_OBJECTIVE_AVX2_CLONE()
template <class T>
__attribute__((RLPT_OBJECTIVE_AVX2_ATTR)) objective_sums
host_rows_avx2(const objective_plan& p, const basic_objective_inputs<T>& in, const basic_objective_grads<T>& gr,
               const row_stats* stats, index_t b0, index_t b1) {
  return host_rows_body<T, host_stages_avx2<T>>(p, in, gr, stats, b0, b1);
}
#endif

#if RLPT_OBJECTIVE_AVX512_CLONE()
template <class T>
__attribute__((RLPT_OBJECTIVE_AVX512_ATTR)) objective_sums
host_rows_avx512(const objective_plan& p, const basic_objective_inputs<T>& in, const basic_objective_grads<T>& gr,
                 const row_stats* stats, index_t b0, index_t b1) {
  return host_rows_body<T, host_stages_avx512<T>>(p, in, gr, stats, b0, b1);
}
#endif

//! The rows kernel for this CPU.
template <class T> auto host_rows_kernel() noexcept {
#if RLPT_OBJECTIVE_AVX512_CLONE()
  if (cpu_has_avx512()) return &host_rows_avx512<T>;
#endif
#if RLPT_OBJECTIVE_AVX2_CLONE()
  if (cpu_has_avx2_fma()) return &host_rows_avx2<T>;
#endif
  return &host_rows_default<T>;
}

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
