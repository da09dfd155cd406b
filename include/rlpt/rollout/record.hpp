// SPDX-License-Identifier: Apache-2.0
//! @file
//! Token-native trajectory records: what an inference engine produced for one sample.
//!
//! A `trajectory` is columnar: one array per per-token field (token ids, loss mask, behaviour
//! logprobs, policy versions, per-token rewards, extras such as routed experts or teacher
//! logprobs), all indexed by the same token position, plus per-sample fields (group id,
//! scalar reward channels, prompt length, turn/segment spans). The loss mask is separate from
//! any attention mask: padding is never derived from token values. Per-token versions follow
//! AReaL: -1 for tokens no policy generated (prompt, tool output, environment), otherwise the
//! version of the policy that sampled the token, so a resumed partial rollout keeps the
//! versions of the tokens it already has.
//!
//! `trajectory_view` is the zero-copy view of one record (also of one row of a batch);
//! `trajectory_builder` builds multi-turn records append-only (model tokens, then environment
//! tokens masked out), with the strict token-in/token-out prefix check; `validate` rejects a
//! record that breaks an invariant with an error naming the field.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/core/views.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

//! Token ids as engines and torch int32 tensors carry them.
using token_id = std::int32_t;
//! Policy version (bumped by one at every weight publish); int32 as AReaL stores them.
using policy_version = std::int32_t;
//! The version of tokens no policy generated: prompt, tool output, environment, template.
inline constexpr policy_version no_version = -1;

//! Who produced a span of tokens (provenance for multi-turn and tool use).
enum class token_source : std::uint8_t { prompt, model, tool, environment, chat_template };

[[nodiscard]] constexpr std::string_view name(token_source s) noexcept {
  switch (s) {
  case token_source::prompt:
    return "prompt";
  case token_source::model:
    return "model";
  case token_source::tool:
    return "tool";
  case token_source::environment:
    return "environment";
  case token_source::chat_template:
    return "chat_template";
  }
  return "?";
}

//! A turn span: tokens [begin, end) of a record, produced by `source` in turn `turn`.
struct segment {
  index_t begin = 0;
  index_t end = 0;
  token_source source = token_source::model;
  std::int32_t turn = 0;

  friend bool operator==(const segment&, const segment&) = default;
};

namespace detail {

[[nodiscard]] constexpr std::size_t usize(index_t n) noexcept { return static_cast<std::size_t>(n); }
[[nodiscard]] constexpr index_t isize(std::size_t n) noexcept { return static_cast<index_t>(n); }

//! Element storage of a per-token extra column: the elements of one rlpt::dtype, held as bytes.
//! Every dtype is trivially copyable, and the allocation (::operator new) is aligned for each of
//! them. One class rather than a std::variant of eight vectors: the variant's dozen visits
//! instantiated every vector operation for eight element types in each translation unit that
//! includes the rollout block.
class extra_storage {
public:
  extra_storage() = default;
  explicit extra_storage(dtype t) : type_(t) {
    RLPT_CHECK(static_cast<std::uint8_t>(t) <= static_cast<std::uint8_t>(dtype::i64), errors::rollout::bad_extra,
               "unknown dtype code {}", static_cast<int>(t));
  }
  template <class T> explicit extra_storage(view<const T> values) : type_(dtype_of<T>) {
    bytes_.resize(usize(values.size()) * sizeof(T));
    if (!values.empty()) std::memcpy(bytes_.data(), values.data(), bytes_.size());
  }

  [[nodiscard]] dtype type() const noexcept { return type_; }
  //! Elements held.
  [[nodiscard]] std::size_t size() const noexcept { return bytes_.size() / size_of(type_); }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return bytes_.size(); }
  [[nodiscard]] std::byte* bytes() noexcept { return bytes_.data(); }
  [[nodiscard]] const std::byte* bytes() const noexcept { return bytes_.data(); }

  //! The elements as T; the caller has checked that T is the dtype.
  template <class T> [[nodiscard]] T* data() noexcept {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    return reinterpret_cast<T*>(bytes_.data());
  }
  template <class T> [[nodiscard]] const T* data() const noexcept {
    static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__);
    return reinterpret_cast<const T*>(bytes_.data());
  }

  //! Holds n elements; new ones are zero bytes (0 in every dtype, +0.0 in the floating ones).
  void resize(std::size_t n) { bytes_.resize(n * size_of(type_)); }
  void reserve(std::size_t n) { bytes_.reserve(n * size_of(type_)); }
  void clear() noexcept { bytes_.clear(); }
  //! Appends the elements of `other`, which holds the same dtype (the caller has checked).
  void append(const extra_storage& other) { bytes_.insert(bytes_.end(), other.bytes_.begin(), other.bytes_.end()); }

  //! Same dtype and the same bits (so NaN payloads compare equal to themselves).
  friend bool operator==(const extra_storage& a, const extra_storage& b) noexcept {
    return a.type_ == b.type_ && a.bytes_ == b.bytes_;
  }

private:
  dtype type_ = dtype::f32;
  std::vector<std::byte> bytes_;
};

} // namespace detail

//! Raw, typed, read-only view of a per-token extra column: [tokens, width] row-major.
struct extra_view {
  std::string_view name;
  dtype type = dtype::f32;
  index_t width = 1;
  const void* data = nullptr;
  index_t elements = 0; //!< tokens * width

  //! Typed access; the dtype must match (error otherwise).
  template <class T> [[nodiscard]] view<const T> as() const {
    RLPT_CHECK(dtype_of<T> == type, errors::rollout::extra_dtype, "extra '{}' holds {}, not {}", name, type,
               dtype_of<T>);
    return {static_cast<const T*>(data), elements};
  }
  [[nodiscard]] index_t tokens() const noexcept { return width > 0 ? elements / width : 0; }
};

//! A named per-token extra column owned by a record: routed experts [T, layers * top_k] i32,
//! teacher logprobs [T, 1] f32, ... Values cover every token of the record, prompt included.
struct token_extra {
  std::string name;
  index_t width = 1;            //!< elements per token
  detail::extra_storage values; //!< [T * width], row-major

  token_extra() = default;
  token_extra(std::string n, dtype t, index_t w) : name(std::move(n)), width(w), values(t) {}
  template <class T>
  token_extra(std::string n, index_t w, const std::vector<T>& v)
      : name(std::move(n)), width(w), values(rlpt::view<const T>(v)) {}

  [[nodiscard]] dtype type() const noexcept { return values.type(); }
  [[nodiscard]] index_t elements() const noexcept { return detail::isize(values.size()); }
  //! The values as T (the dtype must match: error otherwise), to read or write in place.
  template <class T> [[nodiscard]] rlpt::view<T> as() & {
    expect_type(dtype_of<T>);
    return {values.data<T>(), elements()};
  }
  template <class T> [[nodiscard]] rlpt::view<const T> as() const& {
    expect_type(dtype_of<T>);
    return {values.data<T>(), elements()};
  }
  template <class T> void as() const&& = delete; // would view a temporary's values
  [[nodiscard]] extra_view view() const& { return {name, type(), width, values.bytes(), elements()}; }
  extra_view view() const&& = delete; // would view a temporary's values

private:
  void expect_type(dtype t) const {
    RLPT_CHECK(t == type(), errors::rollout::extra_dtype, "extra '{}' holds {}, not {}", name, type(), t);
  }
};

//! Declares the per-record fields every record of a stream carries, so that records stack
//! into uniform columns. Defaults are the AReaL/verl record shape for outcome-reward RL.
struct extra_spec {
  std::string name;
  dtype type = dtype::f32;
  index_t width = 1;
  friend bool operator==(const extra_spec&, const extra_spec&) = default;
};

struct record_schema {
  bool logprobs = true;              //!< behaviour logprobs present (AReaL, verl rollout_log_probs)
  bool versions = true;              //!< per-token policy versions present (AReaL)
  index_t reward_channels = 1;       //!< scalar rewards per record (1: outcome reward)
  index_t token_reward_channels = 0; //!< per-token reward channels (0: none)
  std::vector<extra_spec> extras{};  //!< per-token extra columns, in this order

  friend bool operator==(const record_schema&, const record_schema&) = default;
};

namespace detail {

//! The first field in which two schemas differ, naming both values ("" when they are equal):
//! what a restore reports when a checkpoint's schema is not the buffer's.
RLPT_DEFER [[nodiscard]] std::string schema_difference(const record_schema& a, const record_schema& b,
                                                       std::string_view a_name, std::string_view b_name);

} // namespace detail

//! Zero-copy view of one trajectory: every per-token view has `size()` elements (times its
//! width), or is empty when the schema leaves the field out.
struct trajectory_view {
  std::int64_t group_id = 0;
  std::int32_t sample_index = -1;
  index_t prompt_len = 0;
  view<const token_id> tokens;
  view<const mask_t> loss_mask;
  view<const float> logprobs;
  view<const policy_version> versions;
  view<const float> rewards;       //!< [reward_channels]
  view<const float> token_rewards; //!< [T, token_reward_channels] row-major
  view<const segment> segments;
  std::vector<extra_view> extras;

  [[nodiscard]] index_t size() const noexcept { return tokens.size(); }
  [[nodiscard]] index_t response_len() const noexcept { return tokens.size() - prompt_len; }
  [[nodiscard]] view<const token_id> prompt() const { return {tokens.data(), prompt_len}; }
  [[nodiscard]] view<const token_id> response() const {
    return {tokens.data() + prompt_len, tokens.size() - prompt_len};
  }
  //! Tokens that count in the loss.
  [[nodiscard]] index_t loss_tokens() const noexcept {
    index_t n = 0;
    for (const mask_t m : loss_mask) n += m != 0;
    return n;
  }
  //! Oldest / newest policy version among generated tokens (no_version when there is none).
  [[nodiscard]] std::pair<policy_version, policy_version> version_span() const noexcept {
    policy_version lo = no_version, hi = no_version;
    for (const policy_version v : versions)
      if (v >= 0) {
        lo = lo < 0 ? v : std::min(lo, v);
        hi = std::max(hi, v);
      }
    return {lo, hi};
  }
  //! The named extra, or nullptr.
  [[nodiscard]] const extra_view* extra(std::string_view name) const noexcept {
    for (const auto& e : extras)
      if (e.name == name) return &e;
    return nullptr;
  }
};

//! One sample, owning its columns. Plain aggregate: fill the fields or use trajectory_builder.
struct trajectory {
  std::int64_t group_id = 0;            //!< which prompt this answers (any value; groups are keyed by it)
  std::int32_t sample_index = -1;       //!< position within its group; >= 0 fixes the order in a batch
  index_t prompt_len = 0;               //!< tokens [0, prompt_len) are the prompt
  std::vector<token_id> tokens;         //!< prompt + response (+ later turns)
  std::vector<mask_t> loss_mask;        //!< 1 = trained token; 0 for prompt and environment tokens
  std::vector<float> logprobs;          //!< behaviour logprob of each token (0 where no policy sampled it)
  std::vector<policy_version> versions; //!< policy version per token; -1 = not generated
  std::vector<float> rewards;           //!< scalar reward channels
  std::vector<float> token_rewards;     //!< [T, token_reward_channels]
  std::vector<segment> segments;        //!< turn spans, ascending, non-overlapping
  std::vector<token_extra> extras;      //!< per-token extra columns (schema order)

  [[nodiscard]] index_t size() const noexcept { return detail::isize(tokens.size()); }

  trajectory_view view() const&& = delete; // would view a temporary record's columns
  [[nodiscard]] trajectory_view view() const& {
    trajectory_view v{group_id, sample_index, prompt_len,    tokens,   loss_mask, logprobs,
                      versions, rewards,      token_rewards, segments, {}};
    v.extras.reserve(extras.size());
    for (const auto& e : extras) v.extras.push_back(e.view());
    return v;
  }
};

namespace detail {

inline void expect_field(std::string_view field, index_t got, index_t want, std::string_view what) {
  RLPT_CHECK(got == want, errors::rollout::record_size, "trajectory field {} has {} elements, expected {} ({})", field,
             got, want, what);
}

//! Elements of a per-token field of `tokens` tokens, `per_token` each, checked against index_t.
[[nodiscard]] inline index_t field_elements(std::string_view field, index_t tokens, index_t per_token) {
  index_t n = 0;
  RLPT_CHECK(!__builtin_mul_overflow(tokens, per_token, &n), errors::rollout::record_size,
             "trajectory field {} would have {} tokens * {} elements, more than a 64-bit index counts", field, tokens,
             per_token);
  return n;
}

} // namespace detail

//! Checks a schema on its own: channel counts >= 0, extras with a known dtype, a width >= 1
//! and distinct names. Buffers and builders check theirs on construction.
RLPT_DEFER void check_schema(const record_schema& s);

//! Checks one record against the invariants and the schema; the error names the field, the
//! position and the values. Invariants: every per-token field has one entry per token (times
//! its width); prompt tokens are never trained; a trained token has a policy version >= 0 and
//! a finite behaviour logprob; versions are >= -1; rewards are finite; segments are
//! ascending, non-empty, non-overlapping and inside the record.
RLPT_DEFER void validate(const trajectory_view& t, const record_schema& schema);

RLPT_DEFER inline void validate(const trajectory& t, const record_schema& schema) { validate(t.view(), schema); }

//! Options of trajectory_builder.
struct builder_options {
  index_t reward_channels = 1;       //!< as record_schema::reward_channels
  index_t token_reward_channels = 0; //!< as record_schema::token_reward_channels
  bool logprobs = true;              //!< keep behaviour logprobs (schema.logprobs)
  bool versions = true;              //!< keep per-token versions (schema.versions)
  std::vector<extra_spec> extras{};  //!< extra columns, zero-filled as tokens are appended
};

//! Append-only construction of a (multi-turn) record. Each call appends one span:
//! model tokens (trained, with logprobs and versions), or context tokens (tool output,
//! environment observation, chat-template glue: loss mask 0, logprob 0, version -1).
//! `context_from` implements the token-in/token-out rule: the engine's next input must extend
//! the tokens held so far exactly; the new suffix is appended as context, and a mismatch is an
//! error naming the first differing position (never a silent re-tokenisation).
template <class = void> class basic_trajectory_builder {
public:
  basic_trajectory_builder(std::int64_t group_id, view<const token_id> prompt, builder_options opts = {})
      : opts_(std::move(opts)) {
    check_schema(schema());
    t_.group_id = group_id;
    t_.rewards.assign(detail::usize(opts_.reward_channels), 0.0f);
    for (const auto& e : opts_.extras) t_.extras.emplace_back(e.name, e.type, e.width);
    append(prompt, token_source::prompt);
    t_.prompt_len = detail::isize(t_.tokens.size());
  }

  //! Continues a record (e.g. a partial rollout resumed after a weight update). The record
  //! must be valid for these options; its last segment's turn numbering is continued.
  basic_trajectory_builder(trajectory partial, builder_options opts) : opts_(std::move(opts)), t_(std::move(partial)) {
    check_schema(schema());
    validate(t_, schema());
    for (const auto& s : t_.segments) turn_ = std::max(turn_, s.turn + 1);
  }

  //! Appends generated tokens sampled by policy `version`, with their behaviour logprobs.
  //! `mask` (optional) marks which of them train (default: all).
  basic_trajectory_builder& model(view<const token_id> tokens, view<const float> logprobs, policy_version version,
                                  view<const mask_t> mask = {}) {
    RLPT_CHECK(version >= 0, errors::rollout::record_value,
               "model tokens need a policy version >= 0, got {} (use context() for tokens no policy generated)",
               version);
    return model_impl(
        tokens, logprobs, [version](index_t) { return version; }, mask);
  }

  //! As above with one version per token (a generation interrupted by weight updates).
  basic_trajectory_builder& model(view<const token_id> tokens, view<const float> logprobs,
                                  view<const policy_version> versions, view<const mask_t> mask = {}) {
    detail::expect_size("model versions", versions.size(), tokens.size(), "one per appended token");
    for (index_t i = 0; i < versions.size(); ++i)
      RLPT_CHECK(versions[i] >= 0, errors::rollout::record_value, "model versions[{}] = {}; generated tokens need >= 0",
                 i, versions[i]);
    return model_impl(
        tokens, logprobs, [versions](index_t i) { return versions[i]; }, mask);
  }

  //! Appends tokens no policy generated (tool output, observation, template): masked out.
  basic_trajectory_builder& context(view<const token_id> tokens, token_source source = token_source::environment) {
    RLPT_CHECK(source != token_source::model, errors::rollout::bad_option,
               "context() appends tokens no policy generated; use model() for model tokens");
    append(tokens, source);
    return *this;
  }

  //! Token-in/token-out: `next_input` is the engine's full next input. It must start with the
  //! tokens held so far; the rest is appended as context from `source`.
  basic_trajectory_builder& context_from(view<const token_id> next_input,
                                         token_source source = token_source::environment);

  //! Sets scalar reward channel `channel`.
  basic_trajectory_builder& reward(float value, index_t channel = 0) {
    RLPT_CHECK(channel >= 0 && channel < opts_.reward_channels, errors::rollout::bad_option,
               "reward channel {} does not exist (the record has {})", channel, opts_.reward_channels);
    t_.rewards[detail::usize(channel)] = value;
    return *this;
  }

  //! Sets per-token reward channel `channel` at token `position` (sparse process rewards).
  basic_trajectory_builder& token_reward(index_t position, float value, index_t channel = 0) {
    RLPT_CHECK(channel >= 0 && channel < opts_.token_reward_channels, errors::rollout::bad_option,
               "token reward channel {} does not exist (the record has {})", channel, opts_.token_reward_channels);
    RLPT_CHECK(position >= 0 && position < size(), errors::rollout::bad_option,
               "token reward position {} is outside the {} tokens held", position, size());
    t_.token_rewards[detail::usize(position * opts_.token_reward_channels + channel)] = value;
    return *this;
  }

  //! Writes extra `name` for tokens [first, first + values.size() / width).
  template <class T> basic_trajectory_builder& extra(std::string_view name, index_t first, view<const T> values) {
    for (auto& e : t_.extras)
      if (e.name == name) {
        const view<T> v = e.as<T>();
        RLPT_CHECK(
            first >= 0 && first <= size() && values.size() % e.width == 0 && values.size() / e.width <= size() - first,
            errors::rollout::bad_option, "extra '{}' write of {} values at token {} does not fit {} tokens of width {}",
            name, values.size(), first, size(), e.width);
        std::copy(values.begin(), values.end(), v.begin() + first * e.width);
        return *this;
      }
    RLPT_FAIL(errors::rollout::bad_option, "the record has no extra named '{}'", name);
  }

  [[nodiscard]] index_t size() const noexcept { return detail::isize(t_.tokens.size()); }
  [[nodiscard]] const trajectory& peek() const noexcept { return t_; }
  [[nodiscard]] record_schema schema() const {
    return {opts_.logprobs, opts_.versions, opts_.reward_channels, opts_.token_reward_channels, opts_.extras};
  }

  //! The validated record; the builder is left empty.
  [[nodiscard]] trajectory finish() && {
    validate(t_, schema());
    return std::move(t_);
  }
  [[nodiscard]] trajectory finish() & {
    validate(t_, schema());
    return t_;
  }

private:
  template <class Version>
  basic_trajectory_builder& model_impl(view<const token_id> tokens, view<const float> logprobs, Version version,
                                       view<const mask_t> mask) {
    detail::expect_size_or_empty("model mask", mask.size(), tokens.size(), "one per appended token");
    if (opts_.logprobs) detail::expect_size("model logprobs", logprobs.size(), tokens.size(), "one per appended token");
    const index_t base = size();
    append(tokens, token_source::model);
    for (index_t i = 0; i < tokens.size(); ++i) {
      const auto at = detail::usize(base + i);
      t_.loss_mask[at] = mask.empty() ? mask_t{1} : mask[i];
      if (opts_.logprobs) t_.logprobs[at] = logprobs[i];
      if (opts_.versions) t_.versions[at] = version(i);
    }
    ++turn_;
    return *this;
  }

  void append(view<const token_id> tokens, token_source source);

  builder_options opts_;
  trajectory t_;
  std::int32_t turn_ = 0;
};
using trajectory_builder = basic_trajectory_builder<>;
RLPT_EXTERN_TEMPLATE(class basic_trajectory_builder<>)

RLPT_NAMESPACE_END

template <> struct fmt::formatter<rlpt::token_source> : rlpt::detail::name_formatter {
  template <class Ctx> auto format(rlpt::token_source s, Ctx& ctx) const { return format_name(rlpt::name(s), ctx); }
};

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

namespace detail {

RLPT_DEFER RLPT_INLINE std::string schema_difference(const record_schema& a, const record_schema& b,
                                                     std::string_view a_name, std::string_view b_name) {
  if (a.logprobs != b.logprobs)
    return rlpt::detail::format("logprobs is {} in {}, {} in {}", a.logprobs, a_name, b.logprobs, b_name);
  if (a.versions != b.versions)
    return rlpt::detail::format("versions is {} in {}, {} in {}", a.versions, a_name, b.versions, b_name);
  if (a.reward_channels != b.reward_channels)
    return rlpt::detail::format("reward_channels is {} in {}, {} in {}", a.reward_channels, a_name, b.reward_channels,
                                b_name);
  if (a.token_reward_channels != b.token_reward_channels)
    return rlpt::detail::format("token_reward_channels is {} in {}, {} in {}", a.token_reward_channels, a_name,
                                b.token_reward_channels, b_name);
  const std::size_t common = std::min(a.extras.size(), b.extras.size());
  for (std::size_t k = 0; k < common; ++k) {
    const extra_spec& x = a.extras[k];
    const extra_spec& y = b.extras[k];
    if (!(x == y))
      return rlpt::detail::format("extras[{}] is '{}' ({} x {}) in {}, '{}' ({} x {}) in {}", k, x.name, x.type,
                                  x.width, a_name, y.name, y.type, y.width, b_name);
  }
  if (a.extras.size() != b.extras.size()) {
    const bool a_longer = a.extras.size() > b.extras.size();
    const extra_spec& e = (a_longer ? a : b).extras[common];
    return rlpt::detail::format("{} has {} extras and {} has {}: extras[{}] '{}' ({} x {}) is only in {}", a_name,
                                a.extras.size(), b_name, b.extras.size(), common, e.name, e.type, e.width,
                                a_longer ? a_name : b_name);
  }
  return {};
}

} // namespace detail

RLPT_DEFER RLPT_INLINE void check_schema(const record_schema& s) {
  RLPT_CHECK(s.reward_channels >= 0 && s.token_reward_channels >= 0, errors::rollout::bad_option,
             "reward channel counts must be >= 0 (got reward_channels = {} and token_reward_channels = {})",
             s.reward_channels, s.token_reward_channels);
  for (std::size_t k = 0; k < s.extras.size(); ++k) {
    const extra_spec& e = s.extras[k];
    RLPT_CHECK(static_cast<std::uint8_t>(e.type) <= static_cast<std::uint8_t>(dtype::i64), errors::rollout::bad_extra,
               "extras[{}] '{}' has dtype code {}, not an rlpt::dtype", k, e.name, static_cast<int>(e.type));
    RLPT_CHECK(e.width >= 1, errors::rollout::bad_extra, "extras[{}] '{}' has width {}; it must be >= 1", k, e.name,
               e.width);
    for (std::size_t j = 0; j < k; ++j)
      RLPT_CHECK(s.extras[j].name != e.name, errors::rollout::bad_extra,
                 "extras[{}] and extras[{}] are both named '{}'", j, k, e.name);
  }
}

RLPT_DEFER RLPT_INLINE void validate(const trajectory_view& t, const record_schema& schema) {
  const index_t n = t.size();
  RLPT_CHECK(n >= 1, errors::rollout::record_size, "trajectory of group {} has no tokens", t.group_id);
  RLPT_CHECK(t.prompt_len >= 0 && t.prompt_len <= n, errors::rollout::record_value,
             "trajectory field prompt_len = {} is outside [0, {}] (the record has {} tokens)", t.prompt_len, n, n);
  detail::expect_field("loss_mask", t.loss_mask.size(), n, "one per token");
  detail::expect_field("logprobs", t.logprobs.size(), schema.logprobs ? n : 0,
                       schema.logprobs ? "one per token" : "the schema has no logprobs");
  detail::expect_field("versions", t.versions.size(), schema.versions ? n : 0,
                       schema.versions ? "one per token" : "the schema has no versions");
  detail::expect_field("rewards", t.rewards.size(), schema.reward_channels, "one per reward channel");
  detail::expect_field("token_rewards", t.token_rewards.size(),
                       detail::field_elements("token_rewards", n, schema.token_reward_channels),
                       "tokens * token_reward_channels");
  RLPT_CHECK(detail::isize(t.extras.size()) == detail::isize(schema.extras.size()), errors::rollout::record_size,
             "trajectory has {} extras, the schema declares {}", t.extras.size(), schema.extras.size());
  for (std::size_t k = 0; k < schema.extras.size(); ++k) {
    const auto& e = t.extras[k];
    const auto& s = schema.extras[k];
    RLPT_CHECK(e.name == s.name && e.type == s.type && e.width == s.width, errors::rollout::record_value,
               "trajectory extra {} is '{}' ({} x {}), the schema declares '{}' ({} x {})", k, e.name, e.type, e.width,
               s.name, s.type, s.width);
    detail::expect_field(s.name, e.elements, detail::field_elements(s.name, n, s.width), "tokens * width");
  }
  // One branch-free pass finds whether any per-token invariant breaks; only then the detailed
  // checks run to name the first offending position.
  bool bad = false;
  for (index_t i = 0; i < n; ++i) {
    const bool trained = t.loss_mask[i] != 0;
    bad |= trained & (i < t.prompt_len);
    if (schema.versions) {
      bad |= t.versions[i] < no_version;
      bad |= trained & (t.versions[i] < 0);
    }
    if (schema.logprobs) bad |= trained & !std::isfinite(t.logprobs[i]);
  }
  if (RLPT_UNLIKELY(bad)) {
    for (index_t i = 0; i < t.prompt_len; ++i)
      RLPT_CHECK(t.loss_mask[i] == 0, errors::rollout::record_value,
                 "trajectory field loss_mask[{}] = {} is a prompt token (prompt_len {}); prompt tokens are never "
                 "trained",
                 i, t.loss_mask[i], t.prompt_len);
    if (schema.versions)
      for (index_t i = 0; i < n; ++i) {
        RLPT_CHECK(t.versions[i] >= no_version, errors::rollout::record_value,
                   "trajectory field versions[{}] = {} is below -1", i, t.versions[i]);
        RLPT_CHECK(t.loss_mask[i] == 0 || t.versions[i] >= 0, errors::rollout::record_value,
                   "trajectory field versions[{}] = -1 but loss_mask[{}] = 1: a trained token must carry the "
                   "version of the policy that sampled it",
                   i, i);
      }
    if (schema.logprobs)
      for (index_t i = 0; i < n; ++i)
        RLPT_CHECK(t.loss_mask[i] == 0 || std::isfinite(t.logprobs[i]), errors::rollout::record_value,
                   "trajectory field logprobs[{}] = {} is not finite on a trained token", i, t.logprobs[i]);
  }
  for (index_t c = 0; c < t.rewards.size(); ++c)
    RLPT_CHECK(std::isfinite(t.rewards[c]), errors::rollout::record_value,
               "trajectory field rewards[{}] = {} is not finite (group {})", c, t.rewards[c], t.group_id);
  for (index_t i = 0; i < t.token_rewards.size(); ++i)
    RLPT_CHECK(std::isfinite(t.token_rewards[i]), errors::rollout::record_value,
               "trajectory field token_rewards[{}] = {} is not finite", i, t.token_rewards[i]);
  index_t prev_end = 0;
  for (index_t s = 0; s < t.segments.size(); ++s) {
    const segment& g = t.segments[s];
    RLPT_CHECK(g.begin >= prev_end && g.begin < g.end && g.end <= n, errors::rollout::record_value,
               "trajectory field segments[{}] = [{}, {}) is empty, overlaps the previous span (ending at {}) or "
               "leaves the {} tokens",
               s, g.begin, g.end, prev_end, n);
    prev_end = g.end;
  }
}

template <class Tag>
RLPT_INLINE basic_trajectory_builder<Tag>& basic_trajectory_builder<Tag>::context_from(view<const token_id> next_input,
                                                                                       token_source source) {
  const index_t held = detail::isize(t_.tokens.size());
  const index_t common = std::min(held, next_input.size());
  for (index_t i = 0; i < common; ++i)
    RLPT_CHECK(next_input[i] == t_.tokens[detail::usize(i)], errors::rollout::prefix_mismatch,
               "next input differs from the tokens held at position {}: {} != {} (the chat template re-tokenised "
               "the history; fork the record instead of training on re-tokenised text)",
               i, next_input[i], t_.tokens[detail::usize(i)]);
  RLPT_CHECK(next_input.size() >= held, errors::rollout::prefix_mismatch,
             "next input has {} tokens, fewer than the {} already held: it cannot extend the record", next_input.size(),
             held);
  return context(next_input.subview(held, next_input.size() - held), source);
}

template <class Tag>
RLPT_INLINE void basic_trajectory_builder<Tag>::append(view<const token_id> tokens, token_source source) {
  if (tokens.empty()) return;
  const index_t n = tokens.size();
  const index_t base = size();
  t_.tokens.insert(t_.tokens.end(), tokens.begin(), tokens.end());
  t_.loss_mask.resize(t_.tokens.size(), 0);
  if (opts_.logprobs) t_.logprobs.resize(t_.tokens.size(), 0.0f);
  if (opts_.versions) t_.versions.resize(t_.tokens.size(), no_version);
  t_.token_rewards.resize(t_.tokens.size() * detail::usize(opts_.token_reward_channels), 0.0f);
  for (auto& e : t_.extras) e.values.resize(t_.tokens.size() * detail::usize(e.width));
  // One span per append; adjacent context from the same source merges into one span.
  if (source != token_source::model && !t_.segments.empty() && t_.segments.back().source == source &&
      t_.segments.back().end == base) {
    t_.segments.back().end = base + n;
  } else {
    t_.segments.push_back({base, base + n, source, turn_});
  }
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
