// SPDX-License-Identifier: Apache-2.0
// The host row kernels are compiled once per instruction set (baseline, AVX2+FMA, AVX-512) and a
// process runs the one its CPU has. Every build must give the same bits: a result must not depend
// on the machine a run happens to get. The builds this compiler and CPU can run are called
// directly on the same rows, with lengths around the 16-column block and the 512-column chunk
// (rescales), temperatures, −inf columns and every logits type.
#include <rlpt/core/dtype.hpp>
#include <rlpt/logprob/detail/row_kernels.hpp>

#include "support/random.hpp"

#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using rlpt::index_t;
namespace rd = rlpt::detail;
namespace lt = rlpt::test;

namespace {

template <class T> struct builds {
  struct build {
    std::string name;
    std::function<rlpt::lse_state(const T*, index_t, float)> accumulate;
    std::function<rlpt::lse_state(const T*, index_t, float, float, float, index_t, rlpt::mask_t*)> kept;
    std::function<void(const T*, T*, index_t, float, float, float, float, float, float, index_t, index_t)> backward;
    std::function<void(const T*, T*, index_t, float, float, float, float, float, float, index_t, index_t)> truncated;
  };
  std::vector<build> all;

  builds() {
    all.push_back({"generic", rd::row_accumulate_generic<T>, rd::row_accumulate_kept_generic<T>,
                   rd::row_backward_generic<T, T, false>, rd::row_backward_generic<T, T, true>});
#if RLPT_LOGPROB_X86_DISPATCH()
    if (rlpt::detail::cpu_has_avx2_fma())
      all.push_back({"avx2", rd::row_accumulate_avx2<T>, rd::row_accumulate_kept_avx2<T>,
                     rd::row_backward_avx2<T, T, false>, rd::row_backward_avx2<T, T, true>});
#endif
#if RLPT_LOGPROB_AVX512_CLONE()
    if (rlpt::detail::cpu_has_avx512())
      all.push_back({"avx512", rd::row_accumulate_avx512<T>, rd::row_accumulate_kept_avx512<T>,
                     rd::row_backward_avx512<T, T, false>, rd::row_backward_avx512<T, T, true>});
#endif
    // what the process dispatches to
    all.push_back({"dispatched", rd::row_accumulate<T>, rd::row_accumulate_kept<T>, rd::row_backward<T, T, false>,
                   rd::row_backward<T, T, true>});
  }
};

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

template <class T> bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), sizeof(T) * a.size()) == 0;
}

template <class T> void check_builds(std::uint64_t stream) {
  const builds<T> b;
  INFO("builds run here: " << b.all.size() - 1);
  lt::rng rng(stream);
  for (const index_t n : {1, 15, 16, 17, 511, 512, 513, 1000, 2049, 5000}) {
    for (const float t : {1.0f, 0.7f}) {
      std::vector<T> x(static_cast<std::size_t>(n));
      // Rising in steps so that later chunks raise the max (rescales), spread so that exp covers
      // its range, and a few −inf columns (masked vocabulary).
      for (index_t j = 0; j < n; ++j)
        x[static_cast<std::size_t>(j)] = T(static_cast<float>(rng.normal(0.0, 4.0) + static_cast<double>(j / 512)));
      if (n > 20) {
        x[3] = T(-std::numeric_limits<float>::infinity());
        x[static_cast<std::size_t>(n) - 2] = T(-std::numeric_limits<float>::infinity());
      }
      const rlpt::lse_state ref = b.all[0].accumulate(x.data(), n, t);
      const float lse = ref.m + std::log(ref.s), h = lse - ref.m - ref.a / ref.s;
      const float threshold = ref.m - 3.0f;
      const index_t tie = n / 2, target = n / 3;
      std::vector<rlpt::mask_t> kept_ref(static_cast<std::size_t>(n));
      const rlpt::lse_state kref = b.all[0].kept(x.data(), n, t, ref.m, threshold, tie, kept_ref.data());
      std::vector<T> g_ref(x.size()), gt_ref(x.size());
      b.all[0].backward(x.data(), g_ref.data(), n, t, lse, h, 0.8f, -0.3f, threshold, tie, target);
      b.all[0].truncated(x.data(), gt_ref.data(), n, t, lse, h, 0.8f, -0.3f, threshold, tie, target);
      for (std::size_t k = 1; k < b.all.size(); ++k) {
        const auto& other = b.all[k];
        CAPTURE(other.name);
        CAPTURE(n);
        CAPTURE(t);
        const rlpt::lse_state s = other.accumulate(x.data(), n, t);
        CHECK((same_bits(s.m, ref.m) && same_bits(s.s, ref.s) && same_bits(s.a, ref.a)));
        std::vector<rlpt::mask_t> kept(static_cast<std::size_t>(n));
        const rlpt::lse_state ks = other.kept(x.data(), n, t, ref.m, threshold, tie, kept.data());
        CHECK((same_bits(ks.s, kref.s) && same_bits(ks.a, kref.a)));
        CHECK(kept == kept_ref);
        std::vector<T> g(x.size()), gt(x.size());
        other.backward(x.data(), g.data(), n, t, lse, h, 0.8f, -0.3f, threshold, tie, target);
        other.truncated(x.data(), gt.data(), n, t, lse, h, 0.8f, -0.3f, threshold, tie, target);
        CHECK(same_bits(g, g_ref));
        CHECK(same_bits(gt, gt_ref));
      }
    }
  }
}

} // namespace

TEST_CASE("every build of the host row kernels gives the same bits") {
  SUBCASE("float") { check_builds<float>(1); }
  SUBCASE("bf16") { check_builds<rlpt::bf16>(2); }
  SUBCASE("f16") { check_builds<rlpt::f16>(3); }
}
