// SPDX-License-Identifier: Apache-2.0
//! @file
//! Explicit group descriptions: which sequences answer the same prompt.
//!
//! Groups are never "n consecutive rows". They come from a group id per sequence (any order,
//! ragged sizes) or from offsets over contiguous groups, and are stored as CSR: group g owns
//! members()[offsets()[g], offsets()[g+1]), in ascending sequence order. The fixed member
//! order fixes every per-group reduction order, so results do not depend on thread count.
//!
//! A groups object owns its arrays; the views it returns (members, offsets, group_of) borrow
//! them, so they cannot be taken from a temporary groups object (that does not compile).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/checked.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/views.hpp>

#include <unordered_map>
#include <vector>

RLPT_NAMESPACE_BEGIN

class groups {
public:
  //! Most sequences groups built from offsets or a uniform size describe (they allocate one
  //! entry per sequence; from_ids is bounded by its input).
  static constexpr index_t max_items = (index_t{1} << 31) - 1;

  groups() = default;

  //! One group id per sequence; groups are numbered in order of first appearance.
  [[nodiscard]] static groups from_ids(view<const std::int64_t> ids) {
    groups g;
    const index_t n = ids.size();
    g.group_of_.resize(static_cast<std::size_t>(n));
    std::unordered_map<std::int64_t, index_t> slot;
    slot.reserve(static_cast<std::size_t>(n));
    std::vector<index_t> counts;
    for (index_t i = 0; i < n; ++i) {
      auto [it, fresh] = slot.try_emplace(ids[i], static_cast<index_t>(g.ids_.size()));
      if (fresh) {
        g.ids_.push_back(ids[i]);
        counts.push_back(0);
      }
      g.group_of_[static_cast<std::size_t>(i)] = it->second;
      ++counts[static_cast<std::size_t>(it->second)];
    }
    g.fill_members(counts);
    return g;
  }

  //! Contiguous groups: group g is sequences [offsets[g], offsets[g+1]). Empty groups are errors.
  [[nodiscard]] static groups from_offsets(view<const index_t> offsets) {
    RLPT_CHECK(offsets.size() >= 1 && offsets[0] == 0, errors::groups::bad_offsets,
               "group offsets must have G + 1 entries starting at 0 (got {} entries, first {})", offsets.size(),
               offsets.empty() ? index_t{-1} : offsets[0]);
    detail::check_offsets(errors::groups::bad_offsets, "offsets", "group", offsets, true);
    RLPT_CHECK(offsets[offsets.size() - 1] <= max_items, errors::groups::bad_offsets,
               "group offsets end at {} sequences (offsets[{}]), more than groups describe (at most {})",
               offsets[offsets.size() - 1], offsets.size() - 1, max_items);
    groups g;
    const index_t num = offsets.size() - 1;
    std::vector<index_t> counts(static_cast<std::size_t>(num));
    g.ids_.reserve(static_cast<std::size_t>(num));
    g.group_of_.reserve(static_cast<std::size_t>(offsets[num]));
    for (index_t k = 0; k < num; ++k) {
      counts[static_cast<std::size_t>(k)] = offsets[k + 1] - offsets[k];
      g.ids_.push_back(k);
      for (index_t i = offsets[k]; i < offsets[k + 1]; ++i) g.group_of_.push_back(k);
    }
    g.fill_members(counts);
    return g;
  }

  //! n sequences in consecutive groups of `size` (the common fixed-n rollout shape).
  [[nodiscard]] static groups uniform(index_t n, index_t size) {
    RLPT_CHECK(size >= 1 && n >= 0 && n % size == 0, errors::groups::bad_size,
               "{} sequences cannot be split into groups of {}", n, size);
    RLPT_CHECK(n <= max_items, errors::groups::bad_size, "{} sequences are more than groups describe (at most {})", n,
               max_items);
    std::vector<index_t> offsets(static_cast<std::size_t>(n / size + 1));
    for (std::size_t k = 0; k < offsets.size(); ++k) offsets[k] = static_cast<index_t>(k) * size;
    return from_offsets(offsets);
  }

  [[nodiscard]] index_t num_groups() const noexcept { return static_cast<index_t>(ids_.size()); }
  [[nodiscard]] index_t num_items() const noexcept { return static_cast<index_t>(group_of_.size()); }
  [[nodiscard]] index_t size(index_t g) const noexcept {
    return offsets_[static_cast<std::size_t>(g) + 1] - offsets_[static_cast<std::size_t>(g)];
  }
  //! Sequence indices of group g, ascending.
  [[nodiscard]] view<const index_t> members(index_t g) const& noexcept {
    return {members_.data() + offsets_[static_cast<std::size_t>(g)], size(g)};
  }
  [[nodiscard]] index_t group_of(index_t item) const noexcept { return group_of_[static_cast<std::size_t>(item)]; }
  //! The caller's id of group g (its position for from_offsets/uniform).
  [[nodiscard]] std::int64_t id(index_t g) const noexcept { return ids_[static_cast<std::size_t>(g)]; }

  //! CSR arrays, e.g. to copy to a device: offsets (G + 1), members (N), group_of (N).
  [[nodiscard]] view<const index_t> offsets() const& noexcept { return offsets_; }
  [[nodiscard]] view<const index_t> members() const& noexcept { return members_; }
  [[nodiscard]] view<const index_t> group_of() const& noexcept { return group_of_; }

  // Views into a temporary groups object would dangle: keep the groups in a variable.
  view<const index_t> members(index_t g) const&& = delete;
  view<const index_t> offsets() const&& = delete;
  view<const index_t> members() const&& = delete;
  view<const index_t> group_of() const&& = delete;

  //! Validates that a per-sequence array covers exactly these groups' items.
  void expect_items(std::string_view what, index_t n) const {
    detail::expect_size(what, n, num_items(), "one per sequence in the groups");
  }

private:
  void fill_members(const std::vector<index_t>& counts) {
    offsets_.assign(counts.size() + 1, 0);
    for (std::size_t k = 0; k < counts.size(); ++k) offsets_[k + 1] = offsets_[k] + counts[k];
    members_.resize(group_of_.size());
    std::vector<index_t> cursor(offsets_.begin(), offsets_.end() - 1);
    for (std::size_t i = 0; i < group_of_.size(); ++i)
      members_[static_cast<std::size_t>(cursor[static_cast<std::size_t>(group_of_[i])]++)] = static_cast<index_t>(i);
  }

  std::vector<index_t> offsets_{0};
  std::vector<index_t> members_;
  std::vector<index_t> group_of_;
  std::vector<std::int64_t> ids_;
};

RLPT_NAMESPACE_END
