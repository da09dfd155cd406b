// SPDX-License-Identifier: Apache-2.0
//! @file
//! Group filters (DAPO dynamic sampling) and the reasons a buffer evicts a group.
//!
//! A filter looks at a complete group and says keep or drop. The buffer runs its filters
//! when a group becomes complete; a dropped group is evicted with the filter's reason and
//! counted, so the producer side can refill (see rollout_buffer::refill). The classic DAPO
//! filter drops groups whose rewards are all equal (zero advantage for every sample).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/rollout/record.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

RLPT_NAMESPACE_BEGIN

//! Why a group left the buffer without being consumed. Counted per reason in buffer_stats.
enum class evict_reason : std::uint8_t {
  filtered,   //!< a reward filter dropped it (DAPO all-equal rewards)
  rejected,   //!< a caller predicate dropped it
  incomplete, //!< closed/aborted with fewer records than its completion policy needs
  overflow,   //!< the buffer was full and its policy drops the oldest ready group (verl MessageQueue)
  stale,      //!< a selector dropped it as too old (staleness window)
  requeued,   //!< a selector handed it back to the producers (e.g. to resume as a partial rollout)
  discarded,  //!< the caller discarded it explicitly
};
inline constexpr std::size_t evict_reason_count = 7;

[[nodiscard]] constexpr std::string_view name(evict_reason r) noexcept {
  switch (r) {
  case evict_reason::filtered:
    return "filtered";
  case evict_reason::rejected:
    return "rejected";
  case evict_reason::incomplete:
    return "incomplete";
  case evict_reason::overflow:
    return "overflow";
  case evict_reason::stale:
    return "stale";
  case evict_reason::requeued:
    return "requeued";
  case evict_reason::discarded:
    return "discarded";
  }
  return "?";
}

//! A complete group as the filters see it.
struct group_view {
  std::int64_t id = 0;
  std::span<const trajectory> records;
};

//! keep(group) == false evicts the group with `reason`.
struct group_filter {
  std::string name;
  evict_reason reason = evict_reason::rejected;
  std::function<bool(const group_view&)> keep;
};

namespace filters {

//! DAPO dynamic sampling: keep a group only if the population std of reward channel
//! `channel` across its records exceeds `eps`.
//! eps = 0 is verl's rule (drop when np.std == 0); slime's check_reward_nonzero_std uses 1e-6.
//! Single-record groups have no spread; verl keeps them (`len > 1` guard), as does the default.
struct nonzero_std {
  index_t channel = 0;
  double eps = 0.0;
  bool keep_singletons = true;

  [[nodiscard]] bool operator()(const group_view& g) const;

  [[nodiscard]] float reward(const trajectory& t) const {
    RLPT_CHECK(channel >= 0 && channel < detail::isize(t.rewards.size()), errors::rollout::bad_option,
               "nonzero_std filter reads reward channel {}, records have {}", channel, t.rewards.size());
    return t.rewards[detail::usize(channel)];
  }
};

//! The DAPO filter as a buffer filter (reason `filtered`).
[[nodiscard]] inline group_filter dapo(nonzero_std f = {}) {
  return {"nonzero_std", evict_reason::filtered, [f](const group_view& g) { return f(g); }};
}

//! A caller predicate (AReaL should_accept_fn): reason `rejected`.
[[nodiscard]] inline group_filter predicate(std::string name, std::function<bool(const group_view&)> keep) {
  return {std::move(name), evict_reason::rejected, std::move(keep)};
}

} // namespace filters
RLPT_NAMESPACE_END

template <> struct fmt::formatter<rlpt::evict_reason> : rlpt::detail::name_formatter {
  template <class Ctx> auto format(rlpt::evict_reason r, Ctx& ctx) const { return format_name(rlpt::name(r), ctx); }
};

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

namespace filters {

RLPT_INLINE bool nonzero_std::operator()(const group_view& g) const {
  const auto n = g.records.size();
  if (n <= 1) return keep_singletons;
  double mean = 0.0;
  for (const auto& t : g.records) mean += static_cast<double>(reward(t));
  mean /= static_cast<double>(n);
  double ss = 0.0;
  for (const auto& t : g.records) {
    const double d = static_cast<double>(reward(t)) - mean;
    ss += d * d;
  }
  return std::sqrt(ss / static_cast<double>(n)) > eps;
}

} // namespace filters

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
