// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/copy.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <vector>

TEST_CASE("copy_bytes copies every byte and nothing outside, at any size and alignment") {
  using copy_fn = void (*)(void*, const void*, std::size_t);
  // copy_bytes (the clone this CPU picks) and each block width itself, whatever the CPU has.
  const copy_fn copies[] = {
      &rlpt::detail::copy_bytes,
      [](void* d, const void* s, std::size_t n) {
        rlpt::detail::copy_blocks<16>(static_cast<unsigned char*>(d), static_cast<const unsigned char*>(s), n);
      },
      [](void* d, const void* s, std::size_t n) {
        rlpt::detail::copy_blocks<32>(static_cast<unsigned char*>(d), static_cast<const unsigned char*>(s), n);
      },
      [](void* d, const void* s, std::size_t n) {
        rlpt::detail::copy_blocks<64>(static_cast<unsigned char*>(d), static_cast<const unsigned char*>(s), n);
      },
  };
  // Zero bytes between null pointers (an empty tensor's data()): nothing to do, and no memcpy of
  // a null pointer, which is undefined even for 0 bytes (the asan preset's UBSan catches it).
  for (const copy_fn copy : copies) copy(nullptr, nullptr, 0);
  std::vector<std::size_t> sizes;
  for (std::size_t n = 0; n <= 200; ++n) sizes.push_back(n);
  for (const std::size_t n : {std::size_t{4095}, std::size_t{4096}, std::size_t{65537}, std::size_t{(1u << 20) + 17}})
    sizes.push_back(n);
  for (std::size_t f = 0; f < std::size(copies); ++f)
    for (const std::size_t n : sizes)
      for (const std::size_t s_off : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{63}})
        for (const std::size_t d_off : {std::size_t{0}, std::size_t{3}, std::size_t{32}}) {
          CAPTURE(f);
          CAPTURE(n);
          CAPTURE(s_off);
          CAPTURE(d_off);
          std::vector<unsigned char> src(n + s_off), dst(n + d_off + 64, 0xA5);
          std::uint32_t x = static_cast<std::uint32_t>(n * 2654435761u + s_off);
          for (auto& c : src) c = static_cast<unsigned char>((x = x * 1664525u + 1013904223u) >> 24);
          copies[f](dst.data() + d_off, src.data() + s_off, n);
          bool same = true, guard = true;
          for (std::size_t i = 0; i < n; ++i) same = same && dst[d_off + i] == src[s_off + i];
          for (std::size_t i = 0; i < d_off; ++i) guard = guard && dst[i] == 0xA5;
          for (std::size_t i = d_off + n; i < dst.size(); ++i) guard = guard && dst[i] == 0xA5;
          CHECK(same);
          CHECK(guard);
        }
}

#if defined(__linux__)
#include "support/pages.hpp"

TEST_CASE("copy_bytes maps a fresh destination's pages before it copies, and copies every byte") {
  const std::size_t page = rlpt::test::page_size(), n = 4u << 20;
  const rlpt::test::fresh_mapping m(n);
  auto* d = m.as<unsigned char>();
  CHECK(m.resident() == 0); // nothing touched yet
  // From byte 100 to 100 bytes before the end: the whole pages inside are mapped in one call.
  rlpt::detail::prefault_for_write(d + 100, n - 200);
  if (rlpt::test::kernel_populates()) CHECK(m.resident(page, n - page) == n / page - 2);
  std::vector<unsigned char> src(n - 200);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 131u + 7u);
  rlpt::detail::copy_bytes(d + 100, src.data(), src.size());
  bool same = true;
  for (std::size_t i = 0; i < src.size(); ++i) same = same && d[100 + i] == src[i];
  CHECK(same);
  for (std::size_t i = 0; i < 100; ++i) CHECK(d[i] == 0);
}
#endif
