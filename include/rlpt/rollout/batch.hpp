// SPDX-License-Identifier: Apache-2.0
//! @file
//! rollout_batch: many trajectories stacked into flat columns with offsets (cu_seqlens).
//!
//! This is what a consumer gets from the buffer and what the trainer packs: contiguous
//! arrays that hand over as raw buffers (no pickled tensor dicts, see NeMo-RL #1877,
//! verl #2847), with whole groups adjacent (group g is rows [group_offsets[g],
//! group_offsets[g+1])) and the per-group metadata the staleness and logging code needs.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/layout.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/rollout/record.hpp>

#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! What the buffer knows about a group: ordinals, size, tokens, and the policy versions
//! that generated it (the staleness family selects on these).
struct group_info {
  std::int64_t id = 0;                      //!< the records' group_id
  std::uint64_t ordinal = 0;                //!< stream ordinal: order in which groups were opened (monotonic)
  std::uint64_t ready_seq = 0;              //!< order in which groups became ready (monotonic)
  index_t samples = 0;                      //!< records in the group
  index_t expected = 0;                     //!< records the group was declared to have
  index_t tokens = 0;                       //!< total tokens of its records
  index_t loss_tokens = 0;                  //!< total trained tokens (loss_mask != 0)
  policy_version head_version = no_version; //!< oldest version among generated tokens (-1: none)
  policy_version tail_version = no_version; //!< newest version among generated tokens (-1: none)
  bool partial = false;                     //!< closed early with fewer than `expected` records

  friend bool operator==(const group_info&, const group_info&) = default;
};

//! One extra column of a batch: [num_tokens, width].
struct batch_extra {
  std::string name;
  index_t width = 1;
  detail::extra_storage values;

  [[nodiscard]] dtype type() const noexcept { return values.type(); }
  template <class T> [[nodiscard]] view<const T> as() const& {
    RLPT_CHECK(dtype_of<T> == type(), errors::rollout::extra_dtype, "extra '{}' holds {}, not {}", name, type(),
               dtype_of<T>);
    return {values.data<T>(), detail::isize(values.size())};
  }
  template <class T> view<const T> as() const&& = delete; // would view a temporary's values
};

template <class = void> class basic_rollout_batch {
public:
  basic_rollout_batch() = default;

  //! Stacks records into columns. `groups` (optional) describes consecutive runs of records
  //! that form groups; without it every record is its own group.
  [[nodiscard]] static basic_rollout_batch gather(std::span<const trajectory* const> records,
                                                  const record_schema& schema,
                                                  std::span<const group_info> groups = {}) {
    basic_rollout_batch b;
    b.assign(records, schema, groups);
    return b;
  }

  //! As gather, into this batch: its arrays keep their capacity, so a consumer that reuses one
  //! batch allocates nothing in the steady state.
  void assign(std::span<const trajectory* const> records, const record_schema& schema,
              std::span<const group_info> groups = {});

  //! Empties the batch, keeping its capacity.
  void clear();
  [[nodiscard]] static basic_rollout_batch gather(std::span<const trajectory> records, const record_schema& schema) {
    std::vector<const trajectory*> p;
    p.reserve(records.size());
    for (const auto& t : records) p.push_back(&t);
    return gather(p, schema);
  }

  [[nodiscard]] index_t size() const noexcept { return detail::isize(prompt_lens_.size()); }
  [[nodiscard]] bool empty() const noexcept { return prompt_lens_.empty(); }
  [[nodiscard]] index_t num_tokens() const noexcept { return offsets_.back(); }
  [[nodiscard]] index_t num_groups() const noexcept { return detail::isize(group_info_.size()); }
  [[nodiscard]] const record_schema& schema() const noexcept { return schema_; }

  //! cu_seqlens: record i is tokens [offsets[i], offsets[i+1]); size() + 1 entries.
  [[nodiscard]] view<const index_t> offsets() const& noexcept { return offsets_; }
  [[nodiscard]] index_t length(index_t i) const noexcept {
    return offsets_[detail::usize(i + 1)] - offsets_[detail::usize(i)];
  }
  //! Record lengths (what the balancers and micro-batch planners take).
  [[nodiscard]] std::vector<index_t> lengths() const {
    std::vector<index_t> l(prompt_lens_.size());
    for (std::size_t i = 0; i < l.size(); ++i) l[i] = offsets_[i + 1] - offsets_[i];
    return l;
  }
  //! Trained tokens per record (loss-aggregation denominators, effective-token balancing).
  [[nodiscard]] std::vector<index_t> loss_token_counts() const {
    std::vector<index_t> c(prompt_lens_.size(), 0);
    for (std::size_t i = 0; i < c.size(); ++i)
      for (index_t t = offsets_[i]; t < offsets_[i + 1]; ++t) c[i] += loss_mask_[detail::usize(t)] != 0;
    return c;
  }

  [[nodiscard]] view<const token_id> tokens() const& noexcept { return tokens_; }
  [[nodiscard]] view<const mask_t> loss_mask() const& noexcept { return loss_mask_; }
  [[nodiscard]] view<const float> logprobs() const& noexcept { return logprobs_; }
  [[nodiscard]] view<const policy_version> versions() const& noexcept { return versions_; }
  //! [num_tokens, token_reward_channels]
  [[nodiscard]] view2d<const float> token_rewards() const& {
    return {token_rewards_.data(), num_tokens(), schema_.token_reward_channels};
  }
  //! [size(), reward_channels]
  [[nodiscard]] view2d<const float> rewards() const& { return {rewards_.data(), size(), schema_.reward_channels}; }
  //! Reward channel `c` of every record as one contiguous column: what the advantage
  //! estimators take (`grpo_advantages(batch.reward_column(), batch.groups(), adv, ...)`).
  [[nodiscard]] std::vector<float> reward_column(index_t c = 0) const {
    RLPT_CHECK(c >= 0 && c < schema_.reward_channels, errors::rollout::bad_selection,
               "reward channel {} does not exist: the batch has {} reward channels", c, schema_.reward_channels);
    std::vector<float> col(detail::usize(size()));
    for (std::size_t i = 0; i < col.size(); ++i)
      col[i] = rewards_[i * detail::usize(schema_.reward_channels) + detail::usize(c)];
    return col;
  }
  [[nodiscard]] view<const index_t> prompt_lens() const& noexcept { return prompt_lens_; }
  [[nodiscard]] view<const std::int64_t> group_ids() const& noexcept { return group_ids_; }
  [[nodiscard]] view<const std::int32_t> sample_indices() const& noexcept { return sample_indices_; }
  //! Segments of all records, record i owning [segment_offsets[i], segment_offsets[i+1]).
  [[nodiscard]] view<const segment> segments() const& noexcept { return segments_; }
  [[nodiscard]] view<const index_t> segment_offsets() const& noexcept { return segment_offsets_; }
  [[nodiscard]] const std::vector<batch_extra>& extras() const& noexcept { return extras_; }
  [[nodiscard]] const batch_extra& extra(std::string_view name) const& {
    for (const auto& e : extras_)
      if (e.name == name) return e;
    RLPT_FAIL(errors::rollout::no_extra, "the batch has no extra named '{}'", name);
  }

  //! Group g is records [group_offsets[g], group_offsets[g+1]).
  [[nodiscard]] view<const index_t> group_offsets() const& noexcept { return group_offsets_; }
  [[nodiscard]] std::span<const group_info> group_infos() const& noexcept { return group_info_; }
  //! The groups as rlpt::groups (for the advantage estimators).
  [[nodiscard]] rlpt::groups groups() const { return rlpt::groups::from_offsets(group_offsets_); }
  //! Packed token layout over offsets() (views this batch: keep it alive).
  [[nodiscard]] token_layout layout() const& { return token_layout::packed(offsets_); }

  //! Zero-copy view of record i.
  [[nodiscard]] trajectory_view operator[](index_t i) const& {
    const auto u = detail::usize(i);
    const index_t b = offsets_[u], n = offsets_[u + 1] - offsets_[u];
    trajectory_view v;
    v.group_id = group_ids_[u];
    v.sample_index = sample_indices_[u];
    v.prompt_len = prompt_lens_[u];
    v.tokens = {tokens_.data() + b, n};
    v.loss_mask = {loss_mask_.data() + b, n};
    if (schema_.logprobs) v.logprobs = {logprobs_.data() + b, n};
    if (schema_.versions) v.versions = {versions_.data() + b, n};
    v.rewards = {rewards_.data() + i * schema_.reward_channels, schema_.reward_channels};
    v.token_rewards = {token_rewards_.data() + b * schema_.token_reward_channels, n * schema_.token_reward_channels};
    v.segments = {segments_.data() + segment_offsets_[u], segment_offsets_[u + 1] - segment_offsets_[u]};
    for (const auto& e : extras_) {
      const void* p = e.values.bytes() + detail::usize(b * e.width) * size_of(e.type());
      v.extras.push_back({e.name, e.type(), e.width, p, n * e.width});
    }
    return v;
  }

  // Views into a temporary batch would dangle as soon as the full expression ends (e.g.
  // `buffer.pop(8).tokens()`): keep the batch in a variable.
  view<const index_t> offsets() const&& = delete;
  view<const token_id> tokens() const&& = delete;
  view<const mask_t> loss_mask() const&& = delete;
  view<const float> logprobs() const&& = delete;
  view<const policy_version> versions() const&& = delete;
  view2d<const float> token_rewards() const&& = delete;
  view2d<const float> rewards() const&& = delete;
  view<const index_t> prompt_lens() const&& = delete;
  view<const std::int64_t> group_ids() const&& = delete;
  view<const std::int32_t> sample_indices() const&& = delete;
  view<const segment> segments() const&& = delete;
  view<const index_t> segment_offsets() const&& = delete;
  const std::vector<batch_extra>& extras() const&& = delete;
  const batch_extra& extra(std::string_view name) const&& = delete;
  view<const index_t> group_offsets() const&& = delete;
  std::span<const group_info> group_infos() const&& = delete;
  token_layout layout() const&& = delete;
  trajectory_view operator[](index_t i) const&& = delete;

  friend bool operator==(const basic_rollout_batch& a, const basic_rollout_batch& b) {
    if (!(a.schema_ == b.schema_ && a.offsets_ == b.offsets_ && a.tokens_ == b.tokens_ &&
          a.loss_mask_ == b.loss_mask_ && a.versions_ == b.versions_ && a.prompt_lens_ == b.prompt_lens_ &&
          a.group_ids_ == b.group_ids_ && a.sample_indices_ == b.sample_indices_ && a.segments_ == b.segments_ &&
          a.segment_offsets_ == b.segment_offsets_ && a.group_offsets_ == b.group_offsets_ &&
          a.group_info_ == b.group_info_ && a.extras_.size() == b.extras_.size()))
      return false;
    // Floats compare by bits, so NaN garbage in masked slots compares equal to itself.
    auto same_bits = [](const std::vector<float>& x, const std::vector<float>& y) {
      return x.size() == y.size() && (x.empty() || std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0);
    };
    if (!same_bits(a.logprobs_, b.logprobs_) || !same_bits(a.rewards_, b.rewards_) ||
        !same_bits(a.token_rewards_, b.token_rewards_))
      return false;
    for (std::size_t k = 0; k < a.extras_.size(); ++k) {
      const auto& x = a.extras_[k];
      const auto& y = b.extras_[k];
      if (x.name != y.name || x.width != y.width || !(x.values == y.values)) return false;
    }
    return true;
  }

private:
  void reserve_rows(std::size_t n) {
    prompt_lens_.reserve(n);
    group_ids_.reserve(n);
    sample_indices_.reserve(n);
    offsets_.reserve(n + 1);
    segment_offsets_.reserve(n + 1);
    rewards_.reserve(n * detail::usize(schema_.reward_channels));
  }
  void reserve_tokens(index_t n) {
    const auto u = detail::usize(n);
    tokens_.reserve(u);
    loss_mask_.reserve(u);
    if (schema_.logprobs) logprobs_.reserve(u);
    if (schema_.versions) versions_.reserve(u);
    token_rewards_.reserve(u * detail::usize(schema_.token_reward_channels));
    if (extras_.empty())
      for (const auto& s : schema_.extras) extras_.push_back({s.name, s.width, detail::extra_storage(s.type)});
    for (auto& e : extras_) e.values.reserve(u * detail::usize(e.width));
  }

  //! Appends one record; it must match the schema (the buffer validated it on push).
  void append(const trajectory& t);

  void validate_shape(const trajectory& t) const;

  void set_groups(std::span<const group_info> groups);

  record_schema schema_;
  std::vector<index_t> offsets_{0};
  std::vector<token_id> tokens_;
  std::vector<mask_t> loss_mask_;
  std::vector<float> logprobs_;
  std::vector<policy_version> versions_;
  std::vector<float> token_rewards_;
  std::vector<float> rewards_;
  std::vector<index_t> prompt_lens_;
  std::vector<std::int64_t> group_ids_;
  std::vector<std::int32_t> sample_indices_;
  std::vector<segment> segments_;
  std::vector<index_t> segment_offsets_{0};
  std::vector<batch_extra> extras_;
  std::vector<index_t> group_offsets_{0};
  std::vector<group_info> group_info_;
};
using rollout_batch = basic_rollout_batch<>;
RLPT_EXTERN_TEMPLATE(class basic_rollout_batch<>)

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

template <class Tag>
RLPT_INLINE void basic_rollout_batch<Tag>::assign(std::span<const trajectory* const> records,
                                                  const record_schema& schema, std::span<const group_info> groups) {
  clear();
  if (!(schema_ == schema)) {
    schema_ = schema;
    extras_.clear();
  }
  reserve_rows(records.size());
  index_t tokens = 0;
  for (const trajectory* t : records) tokens += t->size();
  reserve_tokens(tokens);
  for (const trajectory* t : records) append(*t);
  set_groups(groups);
}

template <class Tag> RLPT_INLINE void basic_rollout_batch<Tag>::clear() {
  offsets_.assign(1, 0);
  tokens_.clear();
  loss_mask_.clear();
  logprobs_.clear();
  versions_.clear();
  token_rewards_.clear();
  rewards_.clear();
  prompt_lens_.clear();
  group_ids_.clear();
  sample_indices_.clear();
  segments_.clear();
  segment_offsets_.assign(1, 0);
  for (auto& e : extras_) e.values.clear();
  group_offsets_.assign(1, 0);
  group_info_.clear();
}

template <class Tag> RLPT_INLINE void basic_rollout_batch<Tag>::append(const trajectory& t) {
  validate_shape(t);
  tokens_.insert(tokens_.end(), t.tokens.begin(), t.tokens.end());
  loss_mask_.insert(loss_mask_.end(), t.loss_mask.begin(), t.loss_mask.end());
  logprobs_.insert(logprobs_.end(), t.logprobs.begin(), t.logprobs.end());
  versions_.insert(versions_.end(), t.versions.begin(), t.versions.end());
  token_rewards_.insert(token_rewards_.end(), t.token_rewards.begin(), t.token_rewards.end());
  rewards_.insert(rewards_.end(), t.rewards.begin(), t.rewards.end());
  for (std::size_t k = 0; k < extras_.size(); ++k) extras_[k].values.append(t.extras[k].values);
  segments_.insert(segments_.end(), t.segments.begin(), t.segments.end());
  segment_offsets_.push_back(detail::isize(segments_.size()));
  prompt_lens_.push_back(t.prompt_len);
  group_ids_.push_back(t.group_id);
  sample_indices_.push_back(t.sample_index);
  offsets_.push_back(detail::isize(tokens_.size()));
}

template <class Tag> RLPT_INLINE void basic_rollout_batch<Tag>::validate_shape(const trajectory& t) const {
  // Cheap structural check only; full validation happens where records enter (buffer push).
  const index_t n = t.size();
  const bool ok =
      detail::isize(t.loss_mask.size()) == n && detail::isize(t.logprobs.size()) == (schema_.logprobs ? n : 0) &&
      detail::isize(t.versions.size()) == (schema_.versions ? n : 0) &&
      detail::isize(t.rewards.size()) == schema_.reward_channels &&
      detail::isize(t.token_rewards.size()) == n * schema_.token_reward_channels && t.extras.size() == extras_.size();
  if (!ok) validate(t, schema_); // throws naming the field
  for (std::size_t k = 0; k < extras_.size(); ++k)
    RLPT_CHECK(t.extras[k].type() == extras_[k].type() && t.extras[k].elements() == n * extras_[k].width,
               errors::rollout::record_value, "trajectory extra '{}' does not match the batch schema", extras_[k].name);
}

template <class Tag> RLPT_INLINE void basic_rollout_batch<Tag>::set_groups(std::span<const group_info> groups) {
  group_offsets_.assign(1, 0);
  group_info_.clear();
  if (groups.empty()) {
    for (index_t i = 0; i < size(); ++i) {
      group_offsets_.push_back(i + 1);
      const trajectory_view v = (*this)[i];
      const auto [lo, hi] = v.version_span();
      group_info_.push_back({group_ids_[detail::usize(i)], static_cast<std::uint64_t>(i), static_cast<std::uint64_t>(i),
                             1, 1, v.size(), v.loss_tokens(), lo, hi, false});
    }
    return;
  }
  index_t at = 0;
  for (std::size_t k = 0; k < groups.size(); ++k) {
    const group_info& g = groups[k];
    RLPT_CHECK(g.samples >= 1 && g.samples <= size() - at, errors::rollout::bad_groups,
               "groups[{}] (id {}) has samples = {}; it must be >= 1 and fit the {} records left of the batch's {}", k,
               g.id, g.samples, size() - at, size());
    at += g.samples;
    group_offsets_.push_back(at);
    group_info_.push_back(g);
  }
  RLPT_CHECK(at == size(), errors::rollout::bad_groups, "group sizes add up to {} records, the batch has {}", at,
             size());
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
