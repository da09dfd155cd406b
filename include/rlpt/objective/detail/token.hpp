// SPDX-License-Identifier: Apache-2.0
//! @file
//! How a token's terms combine, written once for the host and the device. A chunk holds N
//! tokens as arrays: N = 256 on the host, where every stage below is a tight loop with its
//! configuration switch outside, so the compiler vectorises it and the composition costs no
//! per-token dispatch; N = 1 on the device, where the arrays become registers and one thread
//! runs the same stages on its token. The stages, in the order every driver runs them:
//!
//!   load        the chunk's inputs (masked slots, and non-finite ones under nonfinite::mask,
//!               become invalid; absent inputs read as 0; distillation adds to the advantage);
//!               in the passes before and after the token pass, only what they read
//!   correction  importance weight w, rejection, which tokens stay in the loss
//!   stats       row pass only: the sums the sequence-level pieces need (row_stats)
//!   policy      the policy term's value and d value / d logp
//!   kl          the KL estimator's value and d value / d logp
//!   combine     the value term, the gradients (alpha-weighted sums of the terms), the row's
//!               sums and metric counts
//!
//! The drivers (row_stats_pass, token_pass and coupling_pass below) compose them through a stage set
//! S: the host's compiles each stage once per instruction set out of line (detail/host_row.hpp),
//! the device's inlines them (inline_stages). row_sums turns a row's (device: a tile's) sums
//! into objective_sums, so the host and the device also assemble rows alike.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/objective/detail/math.hpp>
#include <rlpt/objective/detail/plan.hpp>
#include <rlpt/objective/inputs.hpp>

#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

RLPT_NO_CONTRACT_BEGIN
RLPT_NAMESPACE_BEGIN
namespace detail {

// The drivers, and the chunk functions that take a stage's callable, are host+device templates whose
// stage set decides where they run: nvcc must not check the host stage sets' calls for the device
// (CCCL's exec-check-disable).
#if defined(__CUDACC__) && !defined(__clang__)
#define RLPT_OBJECTIVE_DRIVER _Pragma("nv_exec_check_disable")
#else
#define RLPT_OBJECTIVE_DRIVER
#endif

//! N tokens of one row, one array per quantity.
template <class T, int N> struct token_chunk {
  T lp[N], old[N], behav[N], ref[N], adv[N];
  T ent[N], v[N], v_old[N], ret[N];
  T w[N];         //!< importance weight (valid tokens; 0 for zero-weighted rejections)
  T pv[N], pg[N]; //!< policy value and d value / d logp (GSPO sequence form: d value / d s)
  T kv[N], kg[N]; //!< KL value and gradient
  T vv[N], vg[N]; //!< value-loss value and gradient
  T tmp[N];       //!< scratch: clamped log rho after correction, x = logp - old after policy
  T sums[8][N];   //!< the values of the sums a stage takes (chunk_sums; the host's chunks only)
  std::uint8_t valid[N], keep[N], inl[N], rej[N];
  std::uint32_t flags[N]; //!< policy clip events
  std::uint8_t vclip[N];
};

//! The constants of a row's token pass in the compute type, formed once per row from row_consts.
template <class T> struct token_consts {
  bool seq_keep = true;                 //!< sequence-level rejection passed
  T w_seq = T(1);                       //!< sequence-level importance weight
  T s_seq = T(0);                       //!< GSPO, SAPO's sequence form: the row's mean log-ratio
  T mean_adv = T(0);                    //!< mean_advantage: the row's mean advantage
  T gmpo_coef = T(0);                   //!< GMPO: d loss_i / d x*_t (the row term's chain factor)
  T vespo_pos = T(1), vespo_neg = T(1); //!< VESPO: the row's phi for A >= 0 and A < 0
  std::uint32_t gmpo_flags = 0;
  T a_policy = T(0);  //!< alpha of the policy term
  T a_kl = T(0);      //!< kl.coef * alpha of the KL term
  T g_entropy = T(0); //!< d loss / d H: -entropy.coef * alpha (0 when the term is off)
  T a_value = T(0);   //!< value.coef * alpha of the value term
};

template <class T> RLPT_HD token_consts<T> make_token_consts(const objective_plan& p, const row_consts& rc) {
  token_consts<T> k;
  k.seq_keep = rc.seq_keep;
  k.w_seq = p.use_is ? T(rc.w_seq) : T(1);
  k.s_seq = T(rc.s_seq);
  k.mean_adv = T(rc.mean_adv);
  k.gmpo_coef =
      rc.gmpo_clamped || rc.len_in <= 0.0 ? T(0) : -T(rc.mean_adv) * T(rc.gmpo_w) * T(rc.gmpo_ratio) / T(rc.len_in);
  k.gmpo_flags = flag_if(rc.gmpo_clamped, flag_clamped);
  k.vespo_pos = T(rc.vespo_pos);
  k.vespo_neg = T(rc.vespo_neg);
  k.a_policy = T(rc.a_policy);
  // kl_seq_ic: the row's sequence ratio scales the KL term's token gradients (its coupling through
  // the mean is coupling_numerator's).
  k.a_kl = p.kl_seq_ic ? T(p.kl.coef * rc.a_kl * rc.kl_r) : T(p.kl.coef * rc.a_kl);
  k.g_entropy = p.use_entropy ? T(-p.entropy_coef * rc.a_entropy) : T(0);
  k.a_value = T(p.value.coef * rc.a_value);
  return k;
}

//! A row's sums over its tokens: the host's per row in fp64 (V = double); the device's per thread
//! over its few tokens in the compute type (fewer live registers), then per block in fp64.
template <class V, class Count> struct token_acc {
  V policy = 0, kl = 0, entropy = 0, value = 0, dcoef = 0, approx_kl = 0, w_sum = 0;
  V w_min = std::numeric_limits<V>::infinity();
  V w_max = -std::numeric_limits<V>::infinity();
  Count valid = 0, in_loss = 0, rejected = 0, nonfinite = 0;
  Count low = 0, high = 0, dual = 0, clamped = 0, vclip = 0;
};

// ---- reductions over a chunk ---------------------------------------------------------------

#if (defined(__GNUC__) || defined(__clang__)) && !defined(__CUDACC__)
#define RLPT_OBJECTIVE_VECTOR_EXT() 1
//! Eight (or four) values of T as one GCC vector (host reductions over a chunk). Each lane does
//! what the scalar loop's lane does, so the results are the same bits; the compiler's vectoriser
//! turned the scalar form into scalar code or gathers once several reductions shared a loop.
template <class T, int L> struct gcc_lanes;
#define RLPT_OBJECTIVE_LANES(T, L)                                                                                     \
  template <> struct gcc_lanes<T, L> {                                                                                 \
    typedef T type __attribute__((vector_size((L) * sizeof(T)))); /* NOLINT(modernize-use-using) */                    \
  }
RLPT_OBJECTIVE_LANES(float, 8);
RLPT_OBJECTIVE_LANES(double, 8);
RLPT_OBJECTIVE_LANES(std::int32_t, 8);
RLPT_OBJECTIVE_LANES(std::int64_t, 8);
RLPT_OBJECTIVE_LANES(double, 4);
#undef RLPT_OBJECTIVE_LANES
template <class T> using lanes8 = typename gcc_lanes<T, 8>::type;
template <class T> using lanes4 = typename gcc_lanes<T, 4>::type;
#else
#define RLPT_OBJECTIVE_VECTOR_EXT() 0
#endif

//! The maxima of v[0..n) (hi) and, with Both, of -v[0..n) (neg_lo) where use[j], over eight
//! lanes in one pass (-inf when no token is used).
template <bool Both, class T, int N>
RLPT_HD_FORCEINLINE void lane_maxima(const T (&v)[N], const std::uint8_t (&use)[N], int n, double& hi, double& neg_lo) {
  constexpr T ninf = -std::numeric_limits<T>::infinity();
  if constexpr (N == 1) {
    hi = static_cast<double>(sel(use[0] != 0, v[0], ninf));
    if constexpr (Both) neg_lo = static_cast<double>(sel(use[0] != 0, -v[0], ninf));
  } else {
    T a[8], b[8];
    int j = 0;
#if RLPT_OBJECTIVE_VECTOR_EXT()
    // The use bytes widened to lane masks in a plain loop, which vectorises (in vector types,
    // __builtin_convertvector from 8 bytes to 8 words became byte-by-byte scalar code in g++ 12);
    // then max_r(acc, sel(use, v, acc)) in each of eight lanes, as the loop below.
    using bits_t = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
    using vec = lanes8<T>;
    using bits = lanes8<bits_t>;
    bits_t um[N];
    for (int k = 0; k < n; ++k) um[k] = use[k] != 0 ? bits_t(-1) : bits_t(0);
    vec va = ninf - vec{}, vb = va; // every lane -inf
    for (; j + 8 <= n; j += 8) {
      vec x;
      bits u;
      std::memcpy(&x, v + j, sizeof x);
      std::memcpy(&u, um + j, sizeof u);
      const vec xa = u ? x : va;
      va = va > xa ? va : xa;
      if constexpr (Both) {
        const vec xb = u ? -x : vb;
        vb = vb > xb ? vb : xb;
      }
    }
    std::memcpy(a, &va, sizeof a);
    std::memcpy(b, &vb, sizeof b);
#else
    for (int k = 0; k < 8; ++k) a[k] = ninf, b[k] = ninf;
    for (; j + 8 <= n; j += 8)
      for (int k = 0; k < 8; ++k) {
        const bool u = use[j + k] != 0;
        a[k] = max_r(a[k], sel(u, v[j + k], a[k]));
        if constexpr (Both) b[k] = max_r(b[k], sel(u, -v[j + k], b[k]));
      }
#endif
    for (; j < n; ++j) {
      const bool u = use[j] != 0;
      a[0] = max_r(a[0], sel(u, v[j], a[0]));
      if constexpr (Both) b[0] = max_r(b[0], sel(u, -v[j], b[0]));
    }
    T ma = a[0], mb = b[0];
    for (int k = 1; k < 8; ++k) ma = max_r(ma, a[k]), mb = max_r(mb, b[k]);
    hi = static_cast<double>(ma);
    if constexpr (Both) neg_lo = static_cast<double>(mb);
  }
}

//! Maximum of v[0..n) where use[j] (-inf when none).
template <class T, int N> RLPT_HD_FORCEINLINE double lane_max(const T (&v)[N], const std::uint8_t (&use)[N], int n) {
  double hi = 0, unused = 0;
  lane_maxima<false>(v, use, n, hi, unused);
  return hi;
}

#if RLPT_OBJECTIVE_VECTOR_EXT()
//! acc += the eight values at p, widened to double. Eight floats take one vcvtps2pd to a 512-bit
//! register, which GCC 12 does not emit for __builtin_convertvector (it converts two halves of
//! four, then extracts and inserts: four instructions); its AVX-512 builtin does. Only the
//! AVX-512 clone calls this (chunk_sums' Wide), so the builtin never meets a narrower target.
template <class T> RLPT_HD_FORCEINLINE void add_widened(lanes8<double>& acc, const T* p) {
  lanes8<T> x;
  std::memcpy(&x, p, sizeof x);
#if defined(__GNUC__) && !defined(__clang__)
  if constexpr (std::is_same_v<T, float>) {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi" // the vector never crosses a call: this is always inlined
    acc += __builtin_ia32_cvtps2pd512_mask(x, lanes8<double>{}, static_cast<unsigned char>(0xff),
                                           4); // 4: no rounding override
#pragma GCC diagnostic pop
    return;
  }
#endif
  acc += __builtin_convertvector(x, lanes8<double>);
}
#endif

//! The sums a stage takes over a chunk, in one pass: add() writes a term's values to a row of
//! c.sums, finish() adds every row over eight fp64 lanes (value j into lane j % 8, in order,
//! then ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))) and adds each total to its target.
//! The rows' chains are independent, where summing one row at a time waited on its own adds'
//! latency; each total is the one that row alone gives. N == 1 (the device's chunk) adds each
//! value at once. Wide: the eight fp64 lanes as one vector (the AVX-512 build, where eight
//! doubles fill one register); otherwise as two vectors of four. Same additions, same bits.
template <class T, int N, class V, bool Wide = false> class chunk_sums {
public:
  RLPT_HD_FORCEINLINE chunk_sums(token_chunk<T, N>& c, int n) : c_(c), n_(n) {}

  //! Adds value(j) over the chunk's tokens to `to`.
  template <class F> RLPT_HD_FORCEINLINE void add(V& to, F value) {
    if constexpr (N == 1) {
      to += static_cast<V>(static_cast<double>(value(0)));
    } else {
      if (rows_ == max_rows) finish(); // every row in use: take these sums now
      T* row = c_.sums[rows_];
      for (int j = 0; j < n_; ++j) row[j] = value(j);
      to_[rows_++] = &to;
    }
  }

  RLPT_HD_FORCEINLINE void finish() {
    if constexpr (N != 1) {
      // Four rows at a time, then two, then one: each row's total is the same whichever group it
      // is in, and three instantiations (not one per row count, 1 to 8) keep the code each stage
      // clone carries small (docs/performance.md, "Compile time").
      int q = 0;
      for (; q + 4 <= rows_; q += 4) finish_rows<4>(q);
      if (q + 2 <= rows_) {
        finish_rows<2>(q);
        q += 2;
      }
      if (q < rows_) finish_rows<1>(q);
      rows_ = 0;
    }
  }

private:
  //! Adds rows [q0, q0 + K) to their targets.
  template <int K> RLPT_HD_FORCEINLINE void finish_rows(int q0) {
    const T* rows = &c_.sums[q0][0];
    const int n = n_;
    int j = 0;
#if RLPT_OBJECTIVE_VECTOR_EXT()
    // The eight lanes of a row in vectors: the loop as written below, which g++ 12 vectorised
    // badly (scalar converts, inserts) once several rows were interleaved. One vector of eight
    // doubles only where it fits a register (Wide): without AVX-512 g++ 12 kept such a vector in
    // memory and rebuilt it from 64-bit pieces after every add (stores, reloads, pinsrq).
    double acc[K][8];
    if constexpr (Wide) {
      lanes8<double> w[K] = {};
      for (; j + 8 <= n; j += 8)
        for (int q = 0; q < K; ++q) add_widened(w[q], rows + q * N + j);
      for (int q = 0; q < K; ++q)
        for (int k = 0; k < 8; ++k) acc[q][k] = w[q][k];
    } else {
      // Converted as eight, added as two halves: g++ 12 lowers a conversion of four floats to
      // four doubles as two conversions of two and an insert, one of eight as two of four.
      using half = lanes4<double>;
      half lo[K] = {}, hi[K] = {};
      for (; j + 8 <= n; j += 8)
        for (int q = 0; q < K; ++q) {
          lanes8<T> x;
          std::memcpy(&x, rows + q * N + j, sizeof x);
          const lanes8<double> d = __builtin_convertvector(x, lanes8<double>);
          lo[q] += __builtin_shufflevector(d, d, 0, 1, 2, 3);
          hi[q] += __builtin_shufflevector(d, d, 4, 5, 6, 7);
        }
      for (int q = 0; q < K; ++q)
        for (int k = 0; k < 4; ++k) acc[q][k] = lo[q][k], acc[q][k + 4] = hi[q][k];
    }
#else
    double acc[K][8] = {};
    for (; j + 8 <= n; j += 8)
      for (int q = 0; q < K; ++q)
        for (int k = 0; k < 8; ++k) acc[q][k] += static_cast<double>(rows[q * N + j + k]);
#endif
    for (; j < n; ++j)
      for (int q = 0; q < K; ++q) acc[q][0] += static_cast<double>(rows[q * N + j]);
    for (int q = 0; q < K; ++q) {
      const double* a = acc[q];
      *to_[q0 + q] += static_cast<V>(((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])));
    }
  }

  static constexpr int max_rows = static_cast<int>(std::extent_v<decltype(token_chunk<T, N>::sums)>);
  static_assert(max_rows == 8, "finish() takes 1 to 8 rows");

  token_chunk<T, N>& c_;
  int n_;
  int rows_ = 0;
  V* to_[max_rows] = {};
};

template <class F, int N> RLPT_HD_FORCEINLINE std::int32_t count(const F (&v)[N], int n) {
  std::int32_t c = 0;
  for (int j = 0; j < n; ++j) c += v[j] ? 1 : 0;
  return c;
}

// ---- the stages ----------------------------------------------------------------------------

#if RLPT_DEVICE_PASS()
#define RLPT_OBJECTIVE_ROLLED _Pragma("unroll 1")
#else
#define RLPT_OBJECTIVE_ROLLED
#endif

//! Whether a layout slot is a valid token: the mask's bit, or every slot when no mask is given.
template <class T, memory_space M>
RLPT_HD_FORCEINLINE bool mask_valid(const basic_objective_inputs<T, M>& in, index_t i) {
  return in.mask.size() == 0 || in.mask[i] != 0;
}

//! Zeroes the chunk arrays of inputs this call does not have (they are read as 0). Once per
//! chunk object: load never writes them. For the device's one-token chunks; the host
//! value-initialises its chunks instead (host_rows_body), padded slots included.
template <class T, memory_space M, int N>
RLPT_HD_FORCEINLINE void zero_absent(const objective_plan& p, const basic_objective_inputs<T, M>& in,
                                     token_chunk<T, N>& c) {
  auto zero = [](T(&dst)[N]) RLPT_INLINE_LAMBDA {
    for (int j = 0; j < N; ++j) dst[j] = T(0);
  };
  if (in.logp.size() == 0) zero(c.lp);
  if (!p.has_old) zero(c.old);
  if (!p.has_behav) zero(c.behav);
  if (!p.has_ref) zero(c.ref);
  if (!p.has_adv && !p.has_seq_adv) zero(c.adv);
  if (!p.has_entropy) zero(c.ent);
  if (!p.use_value) zero(c.v), zero(c.ret);
  if (!p.use_value || in.old_values.size() == 0) zero(c.v_old);
}

//! Loads tokens [i0, i0 + n) of sequence b (absent inputs stay zero); returns the number of
//! valid tokens with a non-finite input (they become invalid under nonfinite::mask).
//! row: for a pass over the row before or after its token pass (row_stats_pass, coupling_pass),
//! which reads only what correction and stats_chunk read (lp, old, behav; adv for a mean
//! advantage or GMPO). Under nonfinite::raise such a pass needs no non-finite check either: a
//! token's validity does not depend on it, and the token pass counts every one and fails. So it
//! loads those arrays alone and returns 0; under nonfinite::mask, or with distillation (which
//! writes adv), it loads as the token pass does. A flag, not a second instantiation: each host
//! stage is compiled three times (detail/host_row.hpp).
template <class T, memory_space M, int N>
RLPT_HD_FORCEINLINE int load_chunk(const objective_plan& p, const basic_objective_inputs<T, M>& in, index_t b,
                                   index_t i0, int n, token_chunk<T, N>& c, bool row = false) {
  if (in.mask.size() != 0) {
    const mask_t* m = in.mask.data() + i0;
    for (int j = 0; j < n; ++j) c.valid[j] = m[j] != 0 ? 1 : 0;
  } else {
    for (int j = 0; j < n; ++j) c.valid[j] = 1;
  }
  const bool lean = row && p.nonfinite == nonfinite::raise && p.distill_coef == 0.0;
  const bool need_adv = !lean || p.mean_advantage || p.policy == policy_kind::gmpo;
  // Non-finite inputs set c.rej. On the host the copies only note whether any value of the
  // chunk has an all-ones exponent (a max over the exponent bits vectorises with no per-token
  // work), and the flags are computed from the copies for a chunk that has one.
  for (int j = 0; j < n; ++j) c.rej[j] = 0;
  using bits_t = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr bits_t exp_bits = sizeof(T) == 4 ? bits_t(0x7f800000u) : bits_t(0x7ff0000000000000ull);
  bits_t seen = 0;
  const T* copies[9] = {};
  int ncopies = 0;
  auto fill = [&](T(&dst)[N], const view<const T, M>& src, bool present) RLPT_INLINE_LAMBDA {
    if (!present) return;
    const T* s = src.data() + i0;
    if constexpr (N == 1) {
      dst[0] = s[0];
      c.rej[0] = static_cast<std::uint8_t>(c.rej[0] | static_cast<std::uint8_t>(!finite(s[0])));
    } else {
      bits_t e = 0;
      for (int j = 0; j < n; ++j) {
        const T x = s[j];
        dst[j] = x;
        bits_t u;
        std::memcpy(&u, &x, sizeof u);
        u &= exp_bits;
        e = e > u ? e : u;
      }
      seen = seen > e ? seen : e;
      copies[ncopies++] = dst;
    }
  };
  fill(c.lp, in.logp, in.logp.size() != 0);
  fill(c.old, in.old_logp, p.has_old);
  fill(c.behav, in.behav_logp, p.has_behav);
  fill(c.ref, in.ref_logp, p.has_ref && !lean);
  if (p.has_seq_adv && need_adv) {
    const T a = in.seq_adv[b];
    const std::uint8_t bad = finite(a) ? 0 : 1;
    for (int j = 0; j < n; ++j) c.adv[j] = a, c.rej[j] = static_cast<std::uint8_t>(c.rej[j] | bad);
  } else {
    fill(c.adv, in.adv, p.has_adv && need_adv);
  }
  fill(c.ent, in.entropy, p.has_entropy && !lean);
  fill(c.v, in.values, p.use_value && !lean);
  fill(c.ret, in.returns, p.use_value && !lean);
  fill(c.v_old, in.old_values, p.use_value && in.old_values.size() != 0 && !lean);
  if (lean) return 0;
  if (seen == exp_bits)
    for (int k = 0; k < ncopies; ++k) {
      const T* v = copies[k];
      for (int j = 0; j < n; ++j)
        c.rej[j] = static_cast<std::uint8_t>(c.rej[j] | static_cast<std::uint8_t>(!finite(v[j])));
    }
  if (p.distill_coef != 0.0) {
    for (int j = 0; j < n; ++j) c.tmp[j] = T(0);
    RLPT_OBJECTIVE_ROLLED // unrolled on the device, the teachers' loads and weights took ~20 registers
        for (int k = 0; k < p.teachers; ++k) {
      const T* tk = in.teacher_logp.data() + k * in.teacher_logp.row_stride() + i0;
      const T wk = T(p.teacher_w[k]);
      for (int j = 0; j < n; ++j) {
        c.tmp[j] += wk * tk[j];
        c.rej[j] = static_cast<std::uint8_t>(c.rej[j] | static_cast<std::uint8_t>(!finite(tk[j])));
      }
    }
    const T* student = p.student == student_logp::behaviour  ? c.behav
                       : p.student == student_logp::proximal ? c.old
                                                             : c.lp;
    const T coef = T(p.distill_coef);
    // Added to the loaded advantage; without one, c.adv is this chunk's own (it was zeroed once
    // per chunk object, and adding to it carried each chunk's and pass's term into the next).
    const bool base = p.has_adv || p.has_seq_adv;
    for (int j = 0; j < n; ++j) c.adv[j] = sel(base, c.adv[j], T(0)) + coef * (c.tmp[j] - student[j]);
  }
  for (int j = 0; j < n; ++j) c.rej[j] = static_cast<std::uint8_t>(c.rej[j] & c.valid[j]);
  const int bad = count(c.rej, n);
  if (bad != 0 && p.nonfinite == nonfinite::mask)
    for (int j = 0; j < n; ++j) c.valid[j] = static_cast<std::uint8_t>(c.valid[j] & (c.rej[j] ^ 1));
  return bad;
}

//! The log-probs the importance ratio's numerator reads: the proximal policy's (decoupled PPO) or
//! the current one's (verl bypass mode).
template <class T, int N>
RLPT_HD_FORCEINLINE const T* ratio_numerator_of(const objective_plan& p, const token_chunk<T, N>& c) {
  return p.corr.numerator == ratio_numerator::proximal ? c.old : c.lp;
}

//! The statistic S of each token into c.pv, from the clamped log rho in c.tmp (and, for the
//! divergences, the numerator's and the behaviour log-probs). A function forced inline, not a
//! generic lambda (see dppo_loop).
template <rs_stat S, class T, int N> RLPT_HD_FORCEINLINE void rs_stat_loop(const T* num, int n, token_chunk<T, N>& c) {
  for (int j = 0; j < n; ++j) c.pv[j] = rs_token_stat(S, c.tmp[j], num[j], c.behav[j]);
}

//! A rejection criterion's statistic of every token into c.pv: what token-level rejection compares
//! and what the sequence levels sum and take the maximum of. Both call it, so the eight statistics'
//! loops are compiled once per instruction set (the host's rs_stats stage), not once in correction
//! and again in stats: they were a quarter of the code of a TU calling evaluate.
template <class T, int N>
RLPT_HD_FORCEINLINE void rs_stat_chunk(const objective_plan& p, rs_stat s, int n, token_chunk<T, N>& c) {
  const T* num = ratio_numerator_of(p, c);
  switch (s) {
  case rs_stat::ratio:
    rs_stat_loop<rs_stat::ratio>(num, n, c);
    break;
  case rs_stat::k1:
    rs_stat_loop<rs_stat::k1>(num, n, c);
    break;
  case rs_stat::k2:
    rs_stat_loop<rs_stat::k2>(num, n, c);
    break;
  case rs_stat::k3:
    rs_stat_loop<rs_stat::k3>(num, n, c);
    break;
  case rs_stat::binary_kl:
    rs_stat_loop<rs_stat::binary_kl>(num, n, c);
    break;
  case rs_stat::tv:
    rs_stat_loop<rs_stat::tv>(num, n, c);
    break;
  case rs_stat::log_ratio:
    rs_stat_loop<rs_stat::log_ratio>(num, n, c);
    break;
  case rs_stat::k3_inverse:
    rs_stat_loop<rs_stat::k3_inverse>(num, n, c);
    break;
  case rs_stat::none:
    for (int j = 0; j < n; ++j) c.pv[j] = T(0);
    break;
  }
}

//! rs_stat_chunk called directly (inlined): the device's, and the default of the chunk functions.
struct rs_stats_inline {
  template <class T, int N>
  RLPT_HD_FORCEINLINE void operator()(const objective_plan& p, rs_stat s, int n, token_chunk<T, N>& c) const {
    rs_stat_chunk(p, s, n, c);
  }
};

//! Token-level rejection by criterion r: clears c.keep where the statistic in c.pv fails it, with
//! the test of statistic S (rs_keep: the ratio's, k1's, log_ratio's, or a divergence's bound).
template <rs_stat S, class T, int N>
RLPT_HD_FORCEINLINE void rs_keep_loop(const rs_plan& r, int n, token_chunk<T, N>& c) {
  const T lo = T(r.lo), hi = T(r.hi), llo = T(r.log_lo), lhi = T(r.log_hi);
  for (int j = 0; j < n; ++j)
    c.keep[j] = static_cast<std::uint8_t>(c.keep[j] & (rs_keep(S, c.pv[j], lo, hi, llo, lhi) ? 1 : 0));
}

//! Importance weights, rejection and which tokens stay in the loss. rs_stats(p, stat, n, c) fills
//! c.pv with a criterion's statistic (rs_stats_inline, or the host's out-of-line stage).
RLPT_OBJECTIVE_DRIVER
template <class T, int N, class RsStats = rs_stats_inline>
RLPT_HD_FORCEINLINE void correction_chunk(const objective_plan& p, const token_consts<T>& k, int n,
                                          token_chunk<T, N>& c, RsStats rs_stats = {}) {
  if (!p.use_is && !p.use_rs) {
    for (int j = 0; j < n; ++j) {
      c.w[j] = T(1);
      c.keep[j] = 1;
      c.inl[j] = c.valid[j];
      c.rej[j] = 0;
    }
    return;
  }
  const T cl = T(p.corr.log_ratio_clamp);
  const T* num = ratio_numerator_of(p, c);
  if (p.use_rs || !p.is_seq) // read by the rejection criteria and the token weights only
    for (int j = 0; j < n; ++j) c.tmp[j] = clamp_r(num[j] - c.behav[j], -cl, cl); // clamped log rho
  for (int j = 0; j < n; ++j) c.keep[j] = 1;
  if (p.rs_token)
    for (int i = 0; i < p.rs_count; ++i) {
      const rs_plan& r = p.rs[i];
      if (r.level != rs_level::token || r.stat == rs_stat::none) continue;
      rs_stats(p, r.stat, n, c); // c.pv: scratch until the policy stage writes it
      switch (r.stat) {          // the four tests of rs_keep; the divergences share the last
      case rs_stat::ratio:
        rs_keep_loop<rs_stat::ratio>(r, n, c);
        break;
      case rs_stat::k1:
        rs_keep_loop<rs_stat::k1>(r, n, c);
        break;
      case rs_stat::log_ratio:
        rs_keep_loop<rs_stat::log_ratio>(r, n, c);
        break;
      default:
        rs_keep_loop<rs_stat::k2>(r, n, c);
        break;
      }
    }
  if (!k.seq_keep)
    for (int j = 0; j < n; ++j) c.keep[j] = 0;
  if (p.use_is && !p.is_seq) {
    const is_bound bd = p.corr.weight.bound;
    const T lo = T(p.corr.weight.lo), hi = T(p.corr.weight.hi);
    for (int j = 0; j < n; ++j) c.w[j] = bound_weight(bd, exp_r(c.tmp[j]), lo, hi);
    if (p.w_norm != 1.0) { // batch normalisation, a division as verl's
      const T m = T(p.w_norm);
      for (int j = 0; j < n; ++j) c.w[j] = c.w[j] / m;
    }
  } else {
    const T w = k.w_seq;
    for (int j = 0; j < n; ++j) c.w[j] = w;
  }
  const bool removes = p.removes;
  for (int j = 0; j < n; ++j) {
    const bool keep = c.keep[j] != 0;
    const bool valid = c.valid[j] != 0;
    c.w[j] = sel((!keep) & (!removes), T(0), c.w[j]);
    c.inl[j] = (valid & (keep | (!removes))) ? 1 : 0;
    c.rej[j] = (valid & ((!keep) | (c.w[j] == T(0)))) ? 1 : 0;
  }
}

//! The chunk's share of the row statistics, after load and correction (seq_keep set).
RLPT_OBJECTIVE_DRIVER
template <bool Wide = false, class T, int N, class RsStats = rs_stats_inline>
RLPT_HD_FORCEINLINE void stats_chunk(const objective_plan& p, int n, token_chunk<T, N>& c, row_stats& st,
                                     RsStats rs_stats = {}) {
  st.len += static_cast<double>(count(c.valid, n));
  for (int j = 0; j < n; ++j) c.rej[j] = static_cast<std::uint8_t>(c.valid[j] & c.keep[j]);
  st.len_keep += static_cast<double>(count(c.rej, n));
  chunk_sums<T, N, double, Wide> sums(c, n);
  if (p.rs_seq) {
    rs_stat held = p.rs_held; // the statistic in c.pv: correction's last token criterion's, then ours
    for (int i = 0; i < p.rs_count; ++i) {
      const rs_plan& r = p.rs[i];
      if (r.level == rs_level::token) continue;
      // add() copies the values at once, so the next criterion may overwrite c.pv.
      if (r.stat != held) rs_stats(p, r.stat, n, c);
      held = r.stat;
      sums.add(st.rs_sum[i], [&](int j) RLPT_INLINE_LAMBDA { return sel(c.valid[j] != 0, c.pv[j], T(0)); });
      const double m = lane_max(c.pv, c.valid, n);
      st.rs_max[i] = m > st.rs_max[i] ? m : st.rs_max[i];
      // Each criterion's sum now (a row's total does not depend on its group): the sums' rows
      // then never fill up inside a stage, and the compiler drops add()'s finish for a full
      // set of rows from every call site (a fifth of this stage's code).
      sums.finish();
    }
  }
  if (p.use_is && p.is_seq) {
    const T* num = ratio_numerator_of(p, c);
    sums.add(st.sum_lr, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.valid[j] != 0, num[j] - c.behav[j], T(0)); });
  }
  if (p.w_norm_local && !p.is_seq)
    sums.add(st.sum_w, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.valid[j] != 0, c.w[j], T(0)); });
  if (p.seq_ratio)
    sums.add(st.sum_x, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.inl[j] != 0, c.lp[j] - c.old[j], T(0)); });
  if (p.mean_advantage)
    sums.add(st.sum_adv, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.inl[j] != 0, c.adv[j], T(0)); });
  if (p.policy == policy_kind::vespo)
    sums.add(st.sum_xc, [&](int j) RLPT_INLINE_LAMBDA {
      return sel(c.inl[j] != 0, clamp_r(c.lp[j] - c.old[j], T(-20), T(20)), T(0));
    });
  if (p.fold_w) { // TRL: log of the vLLM ratio, 0 (w = 0, a masked-out ratio) to log 1e-8
    for (int j = 0; j < n; ++j) c.pv[j] = clamp_r(log_r(c.w[j]), T(-18.420680743952367), T(20));
    sums.add(st.sum_logw, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.valid[j] != 0, c.pv[j], T(0)); });
  }
  if (p.policy == policy_kind::gmpo) {
    const gmpo o = p.gm;
    for (int j = 0; j < n; ++j) {
      T xs, dxs;
      std::uint32_t f;
      gmpo_token(o, c.lp[j] - c.old[j], c.adv[j], xs, dxs, f);
      c.pv[j] = sel(c.inl[j] != 0, xs, T(0));
    }
    sums.add(st.sum_xs, [&](int j) RLPT_INLINE_LAMBDA { return c.pv[j]; });
    sums.add(st.sum_adv, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.inl[j] != 0, c.adv[j], T(0)); });
    if (p.use_is && !p.is_seq)
      for (int j = 0; j < n; ++j) // one fp64 chain in token order; GMPO with token weights is rare
        if (c.inl[j]) st.sum_logw += static_cast<double>(log_r(c.w[j] + T(1e-10)));
  }
  sums.finish();
}

//! DPPO's policy loop, one per divergence. A function forced inline, not a generic lambda: a
//! lambda the compiler leaves out of line is compiled for the default instruction set, not the
//! stage clone's (each std::fma of exp then became a call to fmaf: 10x slower).
template <dppo_divergence D, class T, int N>
RLPT_HD_FORCEINLINE void dppo_loop(const dppo o, int n, token_chunk<T, N>& c) {
  for (int j = 0; j < n; ++j) {
    const policy_token<T> q = dppo_token<D>(o, c.tmp[j], c.lp[j], c.old[j], c.adv[j]);
    c.pv[j] = q.value, c.pg[j] = q.grad;
    c.flags[j] = q.flags;
  }
}

//! PPO's policy loop, with or without the dual clip and the delta cap (clip_surrogate); forced
//! inline like dppo_loop.
template <bool Dual, bool Cap, class T, int N>
RLPT_HD_FORCEINLINE void ppo_loop(const ppo_clip o, int n, token_chunk<T, N>& c) {
  for (int j = 0; j < n; ++j) {
    const policy_token<T> q = ppo_token<Dual, Cap>(o, c.tmp[j], c.adv[j]);
    c.pv[j] = q.value, c.pg[j] = q.grad;
    c.flags[j] = q.flags;
  }
}

//! The policy term of each token: value pv and gradient pg (before weights and alpha).
template <class T, int N>
RLPT_HD_FORCEINLINE void policy_chunk(const objective_plan& p, const token_consts<T>& k, int n, token_chunk<T, N>& c) {
  for (int j = 0; j < n; ++j) c.tmp[j] = c.lp[j] - c.old[j]; // x
  // Options copied into locals: the compiler then knows the chunk stores cannot change them
  // and hoists every conversion out of the loops.
  switch (p.policy) {
  case policy_kind::ppo_clip: {
    const bool dual = p.ppo.dual_clip > 0.0, cap = p.ppo.delta > 0.0;
    if (dual && cap)
      ppo_loop<true, true>(p.ppo, n, c);
    else if (dual)
      ppo_loop<true, false>(p.ppo, n, c);
    else if (cap)
      ppo_loop<false, true>(p.ppo, n, c);
    else
      ppo_loop<false, false>(p.ppo, n, c);
    break;
  }
  case policy_kind::gspo: {
    const gspo o = p.gs;
    const T s = k.s_seq;
    if (p.mean_advantage) // AReaL: every token takes its row's mean advantage (no later stage reads adv)
      for (int j = 0; j < n; ++j) c.adv[j] = k.mean_adv;
    for (int j = 0; j < n; ++j) {
      const policy_token<T> q = gspo_token(o, s, c.adv[j]);
      c.pv[j] = q.value, c.pg[j] = q.grad; // sequence form: d value / d s_i, chained by coupling_pass
      c.flags[j] = q.flags;
    }
    break;
  }
  case policy_kind::gmpo: {
    // The row carries GMPO's value (row_sums); each token gets its share of the gradient.
    const T coef = k.gmpo_coef;
    const gmpo o = p.gm;
    const std::uint32_t cl = k.gmpo_flags;
    for (int j = 0; j < n; ++j) {
      T xs, dxs;
      std::uint32_t f;
      gmpo_token(o, c.tmp[j], c.adv[j], xs, dxs, f);
      c.pv[j] = T(0), c.pg[j] = coef * dxs;
      c.flags[j] = f | cl;
    }
    break;
  }
  case policy_kind::cispo: {
    const cispo o = p.ci;
    if (!o.token_level) // the row's ratio for every token (detached: no coupling)
      for (int j = 0; j < n; ++j) c.tmp[j] = k.s_seq;
    for (int j = 0; j < n; ++j) {
      const policy_token<T> q = cispo_token(o, c.tmp[j], c.lp[j], c.adv[j]);
      c.pv[j] = q.value, c.pg[j] = q.grad;
      c.flags[j] = q.flags;
    }
    break;
  }
  case policy_kind::sapo: {
    const sapo o = p.sa;
    if (p.mean_advantage)
      for (int j = 0; j < n; ++j) c.adv[j] = k.mean_adv;
    if (p.sequence_form) { // the gate of the row's ratio; pg is d value / d s, chained by coupling_pass
      const T s = k.s_seq;
      for (int j = 0; j < n; ++j) {
        const policy_token<T> q = sapo_token(o, s, c.adv[j]);
        c.pv[j] = q.value, c.pg[j] = q.grad;
        c.flags[j] = q.flags;
      }
    } else {
      for (int j = 0; j < n; ++j) {
        const policy_token<T> q = sapo_token(o, c.tmp[j], c.adv[j]);
        c.pv[j] = q.value, c.pg[j] = q.grad;
        c.flags[j] = q.flags;
      }
    }
    break;
  }
  case policy_kind::dppo:
    if (p.dp.divergence == dppo_divergence::tv)
      dppo_loop<dppo_divergence::tv>(p.dp, n, c);
    else
      dppo_loop<dppo_divergence::binary_kl>(p.dp, n, c);
    break;
  case policy_kind::dro: {
    const T beta_half = T(0.5 * p.dr.beta);
    for (int j = 0; j < n; ++j) {
      const policy_token<T> q = dro_token(beta_half, c.tmp[j], c.lp[j], c.adv[j]);
      c.pv[j] = q.value, c.pg[j] = q.grad;
      c.flags[j] = 0;
    }
    break;
  }
  case policy_kind::vespo: {
    const T pos = k.vespo_pos, neg = k.vespo_neg;
    for (int j = 0; j < n; ++j) {
      const policy_token<T> q = vespo_token(sel(c.adv[j] >= T(0), pos, neg), c.lp[j], c.adv[j]);
      c.pv[j] = q.value, c.pg[j] = q.grad;
      c.flags[j] = 0;
    }
    break;
  }
  case policy_kind::policy_gradient:
    for (int j = 0; j < n; ++j) {
      const policy_token<T> q = pg_token(c.lp[j], c.adv[j]);
      c.pv[j] = q.value, c.pg[j] = q.grad;
      c.flags[j] = 0;
    }
    break;
  case policy_kind::none:
    for (int j = 0; j < n; ++j) {
      c.pv[j] = T(0), c.pg[j] = T(0);
      c.flags[j] = 0;
    }
    break;
  }
}

//! The KL term of each token: the estimator, then the gradient mode, then the importance
//! correction, each its own loop (4 + 2 + 1 instantiations, not 24 fused ones).
template <class T, int N> RLPT_HD_FORCEINLINE void kl_chunk(const objective_plan& p, int n, token_chunk<T, N>& c) {
  if (!p.use_kl) return;
  if (!p.has_old)
    for (int j = 0; j < n; ++j) c.tmp[j] = T(0); // x = logp - old is 0 without old_logp
  const kl_penalty k = p.kl;                     // a local: see policy_chunk
  auto estimate = [&](auto e) RLPT_INLINE_LAMBDA {
    for (int j = 0; j < n; ++j) {
      const kl_token<T> q = kl_estimate<decltype(e)::value>(k, c.lp[j] - c.ref[j]);
      c.kv[j] = q.value, c.kg[j] = q.grad;
    }
  };
  switch (k.estimator) {
  case kl_estimator::k1:
    estimate(std::integral_constant<kl_estimator, kl_estimator::k1>{});
    break;
  case kl_estimator::abs:
    estimate(std::integral_constant<kl_estimator, kl_estimator::abs>{});
    break;
  case kl_estimator::k2:
    estimate(std::integral_constant<kl_estimator, kl_estimator::k2>{});
    break;
  case kl_estimator::k3:
    estimate(std::integral_constant<kl_estimator, kl_estimator::k3>{});
    break;
  }
  if (k.gradient == kl_gradient::straight_through)
    for (int j = 0; j < n; ++j) c.kg[j] = kl_regrad<kl_gradient::straight_through>(k, c.lp[j] - c.ref[j], c.tmp[j]);
  else if (k.gradient == kl_gradient::k2_importance)
    for (int j = 0; j < n; ++j) c.kg[j] = kl_regrad<kl_gradient::k2_importance>(k, c.lp[j] - c.ref[j], c.tmp[j]);
  if (k.importance_corrected && !k.importance_per_sequence) // per sequence: the row's ratio, in the alphas
    for (int j = 0; j < n; ++j) {
      const kl_token<T> q = kl_importance(kl_token<T>{c.kv[j], c.kg[j]}, c.tmp[j]);
      c.kv[j] = q.value, c.kg[j] = q.grad;
    }
}

//! How the terms combine: the value term over the chunk's n slots, the gradients of tokens
//! [i0, i0 + n_grad) (every one written; tokens outside the loss get 0; n_grad <= n, the host's
//! padded slots are not written) and the chunk's sums added to `a`:
//!   d loss / d logp = a_policy * w * pg + kl.coef * a_kl * kg   (GMPO: w is in its pg;
//!                                                                GSPO sequence form: coupling_pass)
//!   d loss / d H    = -entropy.coef * a_entropy
//!   d loss / d v    = value.coef * a_value * vg
template <bool Wide = false, class T, memory_space M, int N, class V, class Count>
RLPT_HD_FORCEINLINE void combine_chunk(const objective_plan& p, const token_consts<T>& k, index_t i0, int n, int n_grad,
                                       token_chunk<T, N>& c, const basic_objective_grads<T, M>& gr,
                                       token_acc<V, Count>& a) {
  const T ak = k.a_kl;
  const bool kl = p.use_kl;
  const bool seq_form = p.sequence_form;
  // The weight is not the term's factor: GMPO folds it into its row coefficient (and its pv is 0),
  // VESPO with fold_w into its phi.
  const bool folded = p.policy == policy_kind::gmpo || p.fold_w;
  // A sequence-level weight without token rejection is the same for every valid token of the row
  // (correction_chunk), so its sum and extremes need no pass over the chunk: w times the count is
  // exact in fp64, as the lane sums of w were.
  const bool w_row = p.use_is && p.is_seq && !p.rs_token;
  if (gr.logp.size() != 0) {
    T* g = gr.logp.data() + i0;
    const T pf = seq_form ? T(0) : k.a_policy;
    if (kl) {
      for (int j = 0; j < n_grad; ++j) {
        const T v = pf * sel(folded, T(1), c.w[j]) * c.pg[j] + ak * c.kg[j];
        g[j] = sel(c.inl[j] != 0, v, T(0));
      }
    } else {
      for (int j = 0; j < n_grad; ++j) {
        const T v = pf * sel(folded, T(1), c.w[j]) * c.pg[j];
        g[j] = sel(c.inl[j] != 0, v, T(0));
      }
    }
  }
  if (gr.entropy.size() != 0) {
    const T ge = k.g_entropy;
    T* g = gr.entropy.data() + i0;
    for (int j = 0; j < n_grad; ++j) g[j] = sel(c.inl[j] != 0, ge, T(0));
  }
  if (p.use_value) {
    const value_loss o = p.value;
    for (int j = 0; j < n; ++j) {
      const value_token<T> q = value_term(o, c.v[j], c.v_old[j], c.ret[j]);
      c.vv[j] = q.value, c.vg[j] = q.grad, c.vclip[j] = static_cast<std::uint8_t>(q.clipped);
    }
  }
  if (gr.values.size() != 0) {
    const T av = k.a_value;
    const bool on = p.use_value;
    T* g = gr.values.data() + i0;
    for (int j = 0; j < n_grad; ++j) {
      const T v = av * c.vg[j];
      g[j] = sel((c.inl[j] != 0) & on, v, T(0));
    }
  }
  // Term sums over the tokens in the loss.
  chunk_sums<T, N, V, Wide> sums(c, n);
  sums.add(a.policy,
           [&](int j) RLPT_INLINE_LAMBDA { return sel(c.inl[j] != 0, sel(folded, T(1), c.w[j]) * c.pv[j], T(0)); });
  if (seq_form) sums.add(a.dcoef, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.inl[j] != 0, c.w[j] * c.pg[j], T(0)); });
  if (kl) sums.add(a.kl, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.inl[j] != 0, c.kv[j], T(0)); });
  if (p.has_entropy) sums.add(a.entropy, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.inl[j] != 0, c.ent[j], T(0)); });
  if (p.use_value) {
    sums.add(a.value, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.inl[j] != 0, c.vv[j], T(0)); });
    for (int j = 0; j < n; ++j) c.vclip[j] = c.inl[j] & c.vclip[j];
    a.vclip += static_cast<Count>(count(c.vclip, n));
  }
  if (p.has_old)
    sums.add(a.approx_kl, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.inl[j] != 0, c.old[j] - c.lp[j], T(0)); });
  if (p.use_is && !w_row)
    sums.add(a.w_sum, [&](int j) RLPT_INLINE_LAMBDA { return sel(c.valid[j] != 0, c.w[j], T(0)); });
  sums.finish();
  std::int32_t low = 0, high = 0, dual = 0, clamped = 0;
  for (int j = 0; j < n; ++j) {
    const std::uint32_t f = c.flags[j] & (0u - static_cast<std::uint32_t>(c.inl[j]));
    low += static_cast<std::int32_t>(f & flag_low);
    high += static_cast<std::int32_t>((f & flag_high) >> 1);
    dual += static_cast<std::int32_t>((f & flag_dual) >> 2);
    clamped += static_cast<std::int32_t>((f & flag_clamped) >> 3);
  }
  a.low += static_cast<Count>(low);
  a.high += static_cast<Count>(high);
  a.dual += static_cast<Count>(dual);
  a.clamped += static_cast<Count>(clamped);
  const std::int32_t valid = count(c.valid, n);
  a.valid += static_cast<Count>(valid);
  a.in_loss += static_cast<Count>(count(c.inl, n));
  a.rejected += static_cast<Count>(count(c.rej, n));
  if (w_row) {
    if (valid > 0) {
      const T w = !k.seq_keep && !p.removes ? T(0) : k.w_seq;
      a.w_sum += static_cast<V>(static_cast<double>(w) * static_cast<double>(valid));
      const V wv = static_cast<V>(w);
      a.w_max = wv > a.w_max ? wv : a.w_max;
      a.w_min = wv < a.w_min ? wv : a.w_min;
    }
  } else if (p.use_is) {
    double hi_w = 0, neg_lo_w = 0;
    lane_maxima<true>(c.w, c.valid, n, hi_w, neg_lo_w);
    const V hi = static_cast<V>(hi_w);
    a.w_max = hi > a.w_max ? hi : a.w_max;
    const V lo = -static_cast<V>(neg_lo_w);
    a.w_min = lo < a.w_min ? lo : a.w_min;
  } else if (valid > 0) {
    a.w_sum += static_cast<V>(valid);
    a.w_min = a.w_min < V(1) ? a.w_min : V(1);
    a.w_max = a.w_max > V(1) ? a.w_max : V(1);
  }
}

//! GSPO sequence form: adds the row's coupling `scale` to the gradients g[0, n) of the tokens
//! whose in-loss flag (token_chunk::inl after load and correction) is set.
template <class T> RLPT_HD_FORCEINLINE void coupling_chunk(T scale, int n, const std::uint8_t* inl, T* g) {
  for (int j = 0; j < n; ++j) g[j] += sel(inl[j] != 0, scale, T(0));
}

// ---- composition ---------------------------------------------------------------------------

//! The stages called directly (inlined): the device's stage set.
struct inline_stages {
  template <class T, memory_space M, int N>
  RLPT_HD_FORCEINLINE static int load(const objective_plan& p, const basic_objective_inputs<T, M>& in, index_t b,
                                      index_t i0, int n, token_chunk<T, N>& c, bool row = false) {
    return load_chunk(p, in, b, i0, n, c, row);
  }
  template <class T, int N>
  RLPT_HD_FORCEINLINE static void correction(const objective_plan& p, const token_consts<T>& k, int n,
                                             token_chunk<T, N>& c) {
    correction_chunk(p, k, n, c);
  }
  template <class T, int N>
  RLPT_HD_FORCEINLINE static row_stats stats(const objective_plan& p, int n, token_chunk<T, N>& c, row_stats st) {
    stats_chunk(p, n, c, st);
    return st;
  }
  template <class T, int N>
  RLPT_HD_FORCEINLINE static void policy(const objective_plan& p, const token_consts<T>& k, int n,
                                         token_chunk<T, N>& c) {
    policy_chunk(p, k, n, c);
  }
  template <class T, int N> RLPT_HD_FORCEINLINE static void kl(const objective_plan& p, int n, token_chunk<T, N>& c) {
    kl_chunk(p, n, c);
  }
  template <class T, memory_space M, int N, class V, class Count>
  RLPT_HD_FORCEINLINE static token_acc<V, Count> combine(const objective_plan& p, const token_consts<T>& k, index_t i0,
                                                         int n, token_chunk<T, N>& c,
                                                         const basic_objective_grads<T, M>& gr, token_acc<V, Count> a) {
    combine_chunk(p, k, i0, n, n, c, gr, a);
    return a;
  }
};

//! Row-statistics pass over tokens [i0, i0 + n) of row b: adds them to `st`.
RLPT_OBJECTIVE_DRIVER
template <class S, class T, memory_space M, int N>
RLPT_HD_FORCEINLINE row_stats row_stats_pass(const objective_plan& p, const basic_objective_inputs<T, M>& in, index_t b,
                                             index_t i0, int n, token_chunk<T, N>& c, row_stats st) {
  S::load(p, in, b, i0, n, c, /*row=*/true);
  S::correction(p, token_consts<T>{}, n, c); // seq_keep = true: sequence-level rejection is decided from these sums
  return S::stats(p, n, c, st);
}

//! Token pass over tokens [i0, i0 + n) of row b: writes their gradients, adds to the row's sums.
RLPT_OBJECTIVE_DRIVER
template <class S, class T, memory_space M, int N, class V, class Count>
RLPT_HD_FORCEINLINE token_acc<V, Count> token_pass(const objective_plan& p, const token_consts<T>& k,
                                                   const basic_objective_inputs<T, M>& in,
                                                   const basic_objective_grads<T, M>& gr, index_t b, index_t i0, int n,
                                                   token_chunk<T, N>& c, token_acc<V, Count> a) {
  a.nonfinite += static_cast<Count>(S::load(p, in, b, i0, n, c));
  S::correction(p, k, n, c);
  S::policy(p, k, n, c);
  S::kl(p, n, c);
  return S::combine(p, k, i0, n, c, gr, a);
}

//! Sequence form (GSPO, SAPO), kl_seq_ic: d loss / d logp_t = sum_t' d loss_t' / d s * d s / d logp_t with
//! d s / d logp_t = 1 / L (1 for the summed log-ratio), the same for every in-loss token of the row. The
//! numerator, from the row's sums dcoef (sum of w d value / d s) and kl (sum of the KL values):
//! alpha_policy dcoef, and with kl.importance_per_sequence kl.coef alpha_kl d r / d s kl. Linear in the
//! sums, so a row's tiles add.
RLPT_HD_FORCEINLINE double coupling_numerator(const objective_plan& p, const row_consts& rc, double dcoef, double kl) {
  double v = rc.a_policy * dcoef;
  if (p.kl_seq_ic) v += p.kl.coef * rc.a_kl * rc.kl_dr * kl;
  return v;
}

//! The coupling every in-loss token of the row gets: the numerator times d s / d logp_t.
RLPT_HD_FORCEINLINE double sequence_coupling(const row_consts& rc, double numerator) { return numerator / rc.s_den; }

//! Adds the sequence-form coupling to the gradients of tokens [i0, i0 + n) of row b (a second pass:
//! the coupling needs the whole row's dcoef).
RLPT_OBJECTIVE_DRIVER
template <class S, class T, memory_space M, int N>
RLPT_HD_FORCEINLINE void coupling_pass(const objective_plan& p, const token_consts<T>& k,
                                       const basic_objective_inputs<T, M>& in, const basic_objective_grads<T, M>& gr,
                                       T scale, index_t b, index_t i0, int n, token_chunk<T, N>& c) {
  S::load(p, in, b, i0, n, c, /*row=*/true);
  S::correction(p, k, n, c);
  coupling_chunk(scale, n, c.inl, gr.logp.data() + i0);
}

//! The sums of a row (the device: of one tile of a row, `head` being its first) from its token
//! sums: terms weighted by the row's alphas, the row's own GMPO term once, metrics as counted.
template <class V, class Count>
RLPT_HD objective_sums row_sums(const objective_plan& p, const row_consts& rc, const token_acc<V, Count>& a,
                                bool head) {
  objective_sums s;
  double pol = static_cast<double>(a.policy);
  // GMPO's loss is one value per row: -mean(A) * exp(mean x*) * (geometric mean weight).
  if (p.policy == policy_kind::gmpo) pol = head && rc.len_in > 0.0 ? -rc.mean_adv * rc.gmpo_ratio * rc.gmpo_w : 0.0;
  s.policy = rc.a_policy * pol;
  const double kl = p.kl_seq_ic ? static_cast<double>(a.kl) * rc.kl_r : static_cast<double>(a.kl);
  s.kl = rc.a_kl * kl;
  s.entropy = rc.a_entropy * static_cast<double>(a.entropy);
  s.value = rc.a_value * static_cast<double>(a.value);
  s.kl_value = kl;
  s.entropy_value = static_cast<double>(a.entropy);
  s.approx_kl = static_cast<double>(a.approx_kl);
  s.valid = static_cast<double>(a.valid);
  s.in_loss = static_cast<double>(a.in_loss);
  s.seqs = a.valid > 0 ? 1.0 : 0.0;
  s.loss_seqs = a.in_loss > 0 ? 1.0 : 0.0;
  s.rows = head ? 1.0 : 0.0;
  s.clip_low = static_cast<double>(a.low);
  s.clip_high = static_cast<double>(a.high);
  s.clip_dual = static_cast<double>(a.dual);
  s.clamped = static_cast<double>(a.clamped);
  s.rejected = static_cast<double>(a.rejected);
  s.value_clipped = static_cast<double>(a.vclip);
  s.nonfinite = static_cast<double>(a.nonfinite);
  if (a.valid > 0) {
    s.w_sum = static_cast<double>(a.w_sum);
    s.w_min = static_cast<double>(a.w_min);
    s.w_max = static_cast<double>(a.w_max);
  }
  return s;
}

#undef RLPT_OBJECTIVE_DRIVER
#undef RLPT_OBJECTIVE_ROLLED

} // namespace detail
RLPT_NAMESPACE_END
RLPT_NO_CONTRACT_END
