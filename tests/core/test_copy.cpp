// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/copy.hpp>

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
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

TEST_CASE("a fresh output gets huge pages over the whole huge pages inside it, and a mapped one is left as it is") {
  const std::size_t page = rlpt::test::page_size(), huge = page * (page / sizeof(void*));
  const std::size_t n = 4 * huge;
  const rlpt::test::fresh_mapping m(n + huge);
  // An output from a page and 40 bytes past a huge-page boundary h0, three huge pages long: whole
  // huge pages [h0 + huge, h0 + 3 huge) inside, partial ones at both ends.
  const auto base = reinterpret_cast<std::uintptr_t>(m.as<unsigned char>());
  const std::uintptr_t h0 = (base + huge - 1) / huge * huge;
  auto* const out = reinterpret_cast<unsigned char*>(h0 + page + 40);
  const std::size_t bytes = 3 * huge;
  rlpt::detail::prefault_for_write(out, bytes);
  const auto inner = rlpt::test::smaps_of(reinterpret_cast<void*>(h0 + huge));
  const auto head = rlpt::test::smaps_of(out);
  const auto tail = rlpt::test::smaps_of(out + bytes - 1);
  REQUIRE(inner.found);
  CAPTURE(inner.flags);
  CAPTURE(head.flags);
  const bool thp = !rlpt::test::thp_mode().empty();
  if (!rlpt::detail::huge_pages_wanted(std::getenv("RLPT_HUGE_PAGES"))) { // turned off: nothing advised
    CHECK_FALSE(inner.has_flag("hg"));
  } else if (thp) {
    CHECK(inner.has_flag("hg")); // the advice covers exactly [h0 + huge, h0 + 3 huge)
    CHECK(inner.begin == h0 + huge);
    CHECK(inner.end == h0 + 3 * huge);
    CHECK_FALSE(head.has_flag("hg"));
    CHECK_FALSE(tail.has_flag("hg"));
    if (rlpt::test::kernel_populates() && rlpt::test::thp_mode() != "never") {
      MESSAGE("AnonHugePages of the advised range: ", inner.anon_huge_kb, " KiB");
      CHECK(inner.anon_huge_kb > 0); // the kernel may fall back to small pages for some
    }
  }
  for (std::size_t i = 0; i < bytes; i += 4096) REQUIRE(out[i] == 0); // contents untouched

  // A buffer whose first and last pages are mapped (being reused) is not advised.
  const rlpt::test::fresh_mapping r(n + huge);
  const auto rb = (reinterpret_cast<std::uintptr_t>(r.as<unsigned char>()) + huge - 1) / huge * huge;
  auto* const reused = reinterpret_cast<unsigned char*>(rb);
  reused[0] = 1, reused[2 * huge - 1] = 2;
  rlpt::detail::prefault_for_write(reused, 2 * huge);
  CHECK_FALSE(rlpt::test::smaps_of(reused).has_flag("hg"));
  CHECK_FALSE(rlpt::test::smaps_of(reused + huge).has_flag("hg"));
}

TEST_CASE("RLPT_HUGE_PAGES=0 turns the huge-page request off, anything else leaves it on") {
  CHECK(rlpt::detail::huge_pages_wanted(nullptr));
  CHECK(rlpt::detail::huge_pages_wanted("1"));
  CHECK(rlpt::detail::huge_pages_wanted(""));
  CHECK_FALSE(rlpt::detail::huge_pages_wanted("0"));
}
#endif
