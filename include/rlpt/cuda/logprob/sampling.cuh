// SPDX-License-Identifier: Apache-2.0
//! @file
//! Device top-k / top-p / min-p (sampling-consistent) forward: the host algorithm of
//! <rlpt/logprob/detail/truncation.hpp> with one block per row. Digit histograms live in
//! shared memory and are filled with integer atomics (counts, and probability masses in 2^-40
//! fixed point), so the chosen support does not depend on the order threads add in; the digit is
//! found with a block scan; ties at the cut are resolved in column order. The row is then read
//! once more to accumulate the kept mass. The row is read up to ten times, mostly from L2. Min-p
//! needs the row max exactly (the row state keeps it in base-2 units): one more read, its key
//! reduced by an integer atomicMax.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/cuda/logprob/detail.cuh>
#include <rlpt/cuda/logprob/rows.cuh>
#include <rlpt/logprob/detail/truncation.hpp>
#include <rlpt/logprob/from_logits.hpp>
#include <rlpt/logprob/math.hpp>

#include <cub/block/block_scan.cuh>
#include <cuda_runtime.h>

#include <cstdint>

RLPT_NAMESPACE_BEGIN
namespace detail::cuda_lp {

struct truncation_args {
  truncation_rule rule;
  mask_t* kept; // optional [rows, kept_stride]
  index_t kept_stride;
  float* threshold;  // optional [rows]
  index_t* tie_last; // optional [rows]
};

template <int BLOCK> struct truncation_smem {
  using scan = cub::BlockScan<unsigned long long, BLOCK>;
  typename scan::TempStorage scan_storage;
  state2 merge[BLOCK / 32];
  unsigned long long mass[radix_buckets];
  unsigned int count[radix_buckets];
  int digit;
  unsigned int max_key;
  unsigned long long above;
  index_t tie;
};

//! The first digit d, walking from the top, where Σ_{d' > d} val + val[d] ≥ need (need ≥ 1, and
//! the total reaches it). Writes s.digit and s.above (= Σ_{d' > d} val). Every thread returns
//! after the result is visible.
template <int BLOCK, class Val>
__device__ __forceinline__ void select_digit(truncation_smem<BLOCK>& s, int buckets, unsigned long long need, Val val) {
  const int per = (buckets + BLOCK - 1) / BLOCK;
  const int top = buckets - 1 - static_cast<int>(threadIdx.x) * per; // this thread's digits: top, top-1, ...
  unsigned long long local = 0;
  for (int i = 0; i < per; ++i)
    if (top - i >= 0) local += val(top - i);
  unsigned long long before = 0;
  typename truncation_smem<BLOCK>::scan(s.scan_storage).ExclusiveSum(local, before);
  unsigned long long running = before;
  for (int i = 0; i < per; ++i) {
    const int d = top - i;
    if (d < 0) break;
    const unsigned long long v = val(d);
    if (running < need && running + v >= need) {
      s.digit = d;
      s.above = running;
    }
    running += v;
  }
  __syncthreads();
}

template <class T, int BLOCK, class Job>
RLPT_KERNEL void __launch_bounds__(BLOCK)
    truncated_forward_kernel(const T* logits, Job job, forward_args a, truncation_args tr) {
  __shared__ truncation_smem<BLOCK> s;
  const index_t r = blockIdx.x;
  const row_job jb = job(r);
  mask_t* kept = tr.kept != nullptr ? tr.kept + r * tr.kept_stride : nullptr;
  if (!jb.active) {
    if (kept != nullptr)
      for (index_t j = threadIdx.x; j < a.cols; j += BLOCK) kept[j] = 0;
    return;
  }
  const T* x = logits + r * a.stride;
  const index_t n = a.cols;
  const tempering tp = a.tp;
  const state2 full = block_merge<BLOCK>(row_state<T, BLOCK, false>(x, n, tp), s.merge);
  if (!lse2_ok(full)) { // unusable row: NaN outputs, counted
    if (threadIdx.x == 0) write_row(a, x, r, jb, full);
    if (kept != nullptr)
      for (index_t j = threadIdx.x; j < n; j += BLOCK) kept[j] = 0;
    return;
  }
  const float m2 = full.m;
  // masses e^(z − m) in 2^-40 fixed point, from the tempered logit z (as the host's mass_fixed):
  // ties share z, hence their mass, whatever raw logits rounded to it
  const float m_nat = m2 * ln2;
  const auto mass_of = [&](float z) {
    const float e = ex2((z - m_nat) * log2e);
    return static_cast<unsigned long long>(e * 1099511627776.0f);
  };
  const truncation_rule& rule = tr.rule;
  const bool use_k = rule.top_k > 0 && rule.top_k < n, use_p = rule.top_p < 1.0f, use_m = rule.use_min_p();
  std::uint32_t kmin = 0;
  float thr = -INFINITY;
  index_t tie = n - 1;
  if (use_k) {
    std::uint32_t prefix = 0, pmask = 0;
    auto remaining = static_cast<unsigned long long>(rule.top_k);
    for (int level = 0; level < 3; ++level) {
      const radix_level lv = radix_level_at(level);
      const std::uint32_t dmask = (1u << lv.bits) - 1u;
      for (int i = static_cast<int>(threadIdx.x); i < radix_buckets; i += BLOCK) s.count[i] = 0;
      __syncthreads();
      for (index_t j = threadIdx.x; j < n; j += BLOCK) {
        const std::uint32_t key = order_key(temper(load_logit(x[j]), tp));
        if ((key & pmask) == prefix) atomicAdd(&s.count[(key >> lv.shift) & dmask], 1u);
      }
      __syncthreads();
      select_digit<BLOCK>(s, 1 << lv.bits, remaining,
                          [&](int d) { return static_cast<unsigned long long>(s.count[d]); });
      prefix |= static_cast<std::uint32_t>(s.digit) << lv.shift;
      remaining -= s.above;
      pmask |= dmask << lv.shift;
      __syncthreads();
    }
    kmin = prefix;
  }
  std::uint32_t mkey = 0;
  if (use_m) {
    if (threadIdx.x == 0) s.max_key = 0;
    __syncthreads();
    std::uint32_t local = 0;
    for (index_t j = threadIdx.x; j < n; j += BLOCK) {
      const std::uint32_t key = order_key(temper(load_logit(x[j]), tp));
      local = key > local ? key : local;
    }
    atomicMax(&s.max_key, local);
    __syncthreads();
    mkey = min_p_key(key_value(s.max_key), rule.log_min_p);
    // Without top-p the order does not matter: both bounds hold.
    if ((rule.min_p_first || !use_p) && mkey > kmin) kmin = mkey;
  }
  if (use_k || use_m) thr = key_value(kmin);
  if (use_p) {
    std::uint32_t prefix = 0, pmask = 0;
    unsigned long long cum = 0, target = 0;
    int last_digit = 0;
    bool first = true;
    for (int level = 0; level < 3; ++level) {
      const radix_level lv = radix_level_at(level);
      const std::uint32_t dmask = (1u << lv.bits) - 1u;
      for (int i = static_cast<int>(threadIdx.x); i < radix_buckets; i += BLOCK) {
        s.mass[i] = 0;
        s.count[i] = 0;
      }
      __syncthreads();
      for (index_t j = threadIdx.x; j < n; j += BLOCK) {
        const float z = temper(load_logit(x[j]), tp);
        const std::uint32_t key = order_key(z);
        if (key >= kmin && (key & pmask) == prefix) {
          const std::uint32_t d = (key >> lv.shift) & dmask;
          atomicAdd(&s.mass[d], mass_of(z));
          atomicAdd(&s.count[d], 1u);
        }
      }
      __syncthreads();
      if (first) {
        unsigned long long local = 0;
        for (int i = static_cast<int>(threadIdx.x); i < radix_buckets; i += BLOCK) local += s.mass[i];
        unsigned long long ignored = 0, total = 0;
        typename truncation_smem<BLOCK>::scan(s.scan_storage).ExclusiveSum(local, ignored, total);
        __syncthreads();
        const auto t = static_cast<unsigned long long>(static_cast<double>(rule.top_p) * static_cast<double>(total));
        target = t > 0 ? t : 1;
        first = false;
      }
      select_digit<BLOCK>(s, 1 << lv.bits, target - cum, [&](int d) { return s.mass[d]; });
      last_digit = s.digit;
      cum += s.above;
      prefix |= static_cast<std::uint32_t>(last_digit) << lv.shift;
      pmask |= dmask << lv.shift;
      if (lv.shift != 0) __syncthreads(); // the last level's counts are read below
    }
    thr = key_value(prefix);
    const unsigned long long ties = s.count[last_digit];
    const unsigned long long unit = mass_of(thr); // every tie has z == thr
    const unsigned long long keep = kept_ties(cum, target, unit, ties);
    __syncthreads();
    if (keep < ties) {
      unsigned long long seen = 0;
      if (threadIdx.x == 0) s.tie = n - 1;
      for (index_t c0 = 0; c0 < n; c0 += BLOCK) {
        const index_t j = c0 + threadIdx.x;
        const unsigned long long flag = j < n && order_key(temper(load_logit(x[j]), tp)) == prefix ? 1ull : 0ull;
        unsigned long long before = 0, chunk = 0;
        __syncthreads();
        typename truncation_smem<BLOCK>::scan(s.scan_storage).ExclusiveSum(flag, before, chunk);
        if (flag != 0 && seen + before + 1 == keep) s.tie = j;
        seen += chunk;
        if (seen >= keep) break; // uniform: every thread has the same aggregate
      }
      __syncthreads();
      tie = s.tie;
    }
    if (use_m && !rule.min_p_first) intersect_min_p(mkey, n, thr, tie);
  }
  // kept mass, same vector assignment as row_state, relative to the row max (whose own weight
  // may be just below 1: lse2_ok accepts a one-token support, top_k = 1 included)
  constexpr int W = vec_width<T>;
  const index_t nvec = (n + W - 1) / W;
  const bool al = row_aligned(x);
  state2 st{m2, 0.0f, 0.0f};
  for (index_t q = threadIdx.x; q < nvec; q += BLOCK) {
    fvec<T> v = load_vec<T, false>(x, q, n, al, -INFINITY);
    temper_vec(v.v, tp);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const index_t j = q * W + k;
      const float z = v.v[k];
      const bool in = j < n && ((z > thr) || (z == thr && j <= tie));
      lse2_add(st, in ? fmaf(z, log2e, -m2) : -INFINITY); // 2^-inf = 0: nothing added
      if (kept != nullptr && j < n) kept[j] = in ? 1 : 0;
    }
  }
  __syncthreads();
  st = block_merge<BLOCK>(st, s.merge);
  if (threadIdx.x != 0) return;
  if (tr.threshold != nullptr) tr.threshold[r] = thr;
  if (tr.tie_last != nullptr) tr.tie_last[r] = tie;
  if (jb.scored && jb.col >= 0 && jb.col < n) {
    const float zt = temper(load_logit(x[jb.col]), tp);
    if (!((zt > thr) || (zt == thr && jb.col <= tie)) || zt == -INFINITY) {
      // outside the support: −inf, counted (device kernels cannot raise)
      if (a.counters != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(a.counters + 2), 1ull);
      const row_result res = finish(st);
      if (jb.out >= 0) {
        a.logp[jb.out] = -INFINITY;
        if (a.entropy != nullptr) a.entropy[jb.out] = res.entropy;
        if (a.scored != nullptr) a.scored[jb.out] = 0;
      }
      if (a.lse != nullptr) a.lse[r] = res.lse;
      return;
    }
  }
  write_row(a, x, r, jb, st);
}

} // namespace detail::cuda_lp
RLPT_NAMESPACE_END
