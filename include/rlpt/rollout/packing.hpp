// SPDX-License-Identifier: Apache-2.0
//! @file
//! Token-budget micro-batches and the packed (varlen) layout the trainer consumes.
//!
//! plan_microbatches cuts one rank's sequences into micro-batches whose token count never
//! exceeds the budget: Karmarkar–Karp on the cost model with k = ceil(tokens / budget), the
//! cap verified after every attempt and k raised until it holds (verl PR #7553), falling back
//! to first-fit decreasing (AReaL) if KK keeps overshooting; a sequence longer than the budget
//! becomes a micro-batch of its own (tinker-cloud #33) instead of an error. The count can be
//! forced up (min_microbatches: the max over ranks, so FSDP ranks stay in lockstep) and
//! rounded to a multiple (divisor: virtual pipeline stages).
//!
//! plan_step does the whole step on one controller: balance sequences (or whole groups)
//! across ranks, plan each rank's micro-batches with the same count on every rank, and
//! compute the global token / sequence counts that loss aggregation divides by.
//!
//! pack / pack_into lay a micro-batch out for varlen attention: flat tokens, int32
//! cu_seqlens, position ids restarting at 0 for every sequence, loss mask, next-token targets
//! that never cross a sequence boundary (verl #6475), optional alignment padding as a
//! trailing pseudo-sequence (AReaL pads to 256 tokens).
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/checked.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/groups.hpp>
#include <rlpt/core/views.hpp>
#include <rlpt/rollout/balance.hpp>
#include <rlpt/rollout/batch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <utility>
#include <vector>

RLPT_NAMESPACE_BEGIN

enum class pack_algorithm : std::uint8_t {
  karmarkar_karp, //!< balanced micro-batches, cap verified (verl rearrange_micro_batches)
  ffd,            //!< first-fit decreasing: fewest micro-batches (AReaL MicroBatchSpec default)
  //! first fit in the given order (OpenRLHF get_minimum_num_micro_batch_size): the count of a
  //! streaming packer that cannot sort; more micro-batches than ffd on most inputs
  first_fit,
};

struct microbatch_options {
  index_t token_budget = 16384; //!< max tokens per micro-batch (verl ppo_max_token_len_per_gpu = 16384)
  pack_algorithm algorithm = pack_algorithm::karmarkar_karp; //!< verl; AReaL: ffd
  cost_model cost = cost_model::attention(); //!< what KK balances across micro-batches (verl calculate_workload)
  //! At least this many (verl min_num_micro_batch, AReaL n_mbs = 1). Beyond one per sequence
  //! the extra micro-batches are empty; at most max(sequences, max_empty_parts) in all.
  index_t min_microbatches = 1;
  //! Count rounded up to a multiple (verl num_batches_divided_by, AReaL n_mbs_divisor = 1); at
  //! most max(sequences, max_empty_parts).
  index_t divisor = 1;
  bool small_at_ends = true; //!< cheap micro-batches first and last (verl use_dynamic_bsz_balance = True)
  //! When KK overshoots the budget, first move sequences from the over-full micro-batches into
  //! the roomiest ones before trying a larger count (rlpt; verl only raises the count).
  bool repair = true;
  index_t kk_attempts = 8; //!< KK tries (k, k + divisor, ...) before falling back to FFD (rlpt)
};

//! Micro-batch m holds items[offsets[m], offsets[m+1]) (indices into the planner's input).
struct microbatch_plan {
  std::vector<index_t> offsets{0};
  std::vector<index_t> items{};
  std::vector<index_t> tokens{}; //!< tokens per micro-batch
  index_t oversize = 0;          //!< micro-batches holding a single sequence longer than the budget
  index_t empty = 0;             //!< micro-batches with no sequence (forced by min_microbatches / divisor)
  bool fell_back = false;        //!< KK kept overshooting the budget and FFD was used

  [[nodiscard]] index_t num_microbatches() const noexcept { return static_cast<index_t>(offsets.size()) - 1; }
  [[nodiscard]] view<const index_t> microbatch(index_t m) const& {
    const auto u = static_cast<std::size_t>(m);
    return {items.data() + offsets[u], offsets[u + 1] - offsets[u]};
  }
  view<const index_t> microbatch(index_t m) const&& = delete; // would view a temporary plan
  [[nodiscard]] index_t total_tokens() const noexcept {
    return std::accumulate(tokens.begin(), tokens.end(), index_t{0});
  }
  [[nodiscard]] index_t max_tokens() const noexcept {
    return tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  }
};

namespace detail {

//! a rounded up to a multiple of b, for results known to fit (counts bounded by check_count).
[[nodiscard]] inline index_t round_up(index_t a, index_t b) noexcept { return ceil_div(a, b) * b; }

//! Sum of the sequence lengths; each must be >= 0 and the sum must fit index_t (so every
//! partial sum of them does too).
[[nodiscard]] inline index_t total_length(view<const index_t> lengths) {
  index_t total = 0;
  for (index_t i = 0; i < lengths.size(); ++i) {
    RLPT_CHECK(lengths[i] >= 0, errors::rollout::bad_length, "sequence {} has length {}", i, lengths[i]);
    RLPT_CHECK(!add_overflows(total, lengths[i], total), errors::rollout::bad_length,
               "the sequence lengths add up to more than {} tokens (at sequence {}, length {})", index_max, i,
               lengths[i]);
  }
  return total;
}

//! First fit of `ids` in their order into bins of `cap` tokens (every item <= cap). A max segment
//! tree over the bins' free space finds the first bin that fits in O(log bins).
RLPT_DEFER std::vector<std::vector<index_t>> first_fit(std::span<const index_t> ids, view<const index_t> len,
                                                       index_t cap);

//! First-fit decreasing: first_fit of the items by length, longest first (ties by index).
RLPT_DEFER std::vector<std::vector<index_t>> ffd(std::span<const index_t> ids, view<const index_t> len, index_t cap);

[[nodiscard]] inline index_t tokens_of(const std::vector<index_t>& bin, view<const index_t> len) {
  index_t s = 0;
  for (const index_t i : bin) s += len[i];
  return s;
}

//! Moves sequences out of bins over `cap` into the bins with the most room, largest movable
//! sequence first. Returns whether every bin now fits.
RLPT_DEFER bool repair(std::vector<std::vector<index_t>>& bins, view<const index_t> len, index_t cap);

//! Splits the heaviest multi-item bin into two halves by LPT until there are `want` bins or
//! none can be split (slime dp_schedule's rule for raising the count).
RLPT_DEFER void split_to(std::vector<std::vector<index_t>>& bins, index_t want, view<const index_t> len);

} // namespace detail

//! Plans one rank's micro-batches. Every micro-batch holds at most token_budget tokens, except
//! a micro-batch holding one longer sequence (counted in `oversize`). Deterministic.
RLPT_DEFER [[nodiscard]] microbatch_plan plan_microbatches(view<const index_t> lengths,
                                                           const microbatch_options& o = {});

//! Micro-batch count a rank would use on its own (all-reduce MAX these across ranks, then plan
//! with min_microbatches = that maximum; repeat if some rank still needs more).
RLPT_DEFER [[nodiscard]] inline index_t count_microbatches(view<const index_t> lengths,
                                                           const microbatch_options& o = {}) {
  return plan_microbatches(lengths, o).num_microbatches();
}

// --- a whole step on one controller ------------------------------------------------------------

struct step_options {
  index_t ranks = 1;               //!< data-parallel ranks
  balance_options balance{};       //!< rank balancing (its `ranks` is ignored; this one counts)
  bool groups_atomic = false;      //!< keep each group on one rank (needs groups)
  microbatch_options microbatch{}; //!< per-rank micro-batching
  bool equal_microbatches = true;  //!< same micro-batch count on every rank (verl same_micro_num_in_dp = True)
};

struct rank_plan {
  std::vector<index_t> items{};   //!< sequence indices of this rank, ascending
  microbatch_plan microbatches{}; //!< over global sequence indices
  index_t tokens = 0;
  index_t loss_tokens = 0; //!< trained tokens on this rank (needs loss token counts)
  index_t sequences = 0;
};

//! The normalisers a loss aggregation needs for the whole step (all ranks, all micro-batches).
struct step_totals {
  index_t tokens = 0;                //!< all tokens
  index_t loss_tokens = 0;           //!< trained tokens: the token-mean denominator
  index_t sequences = 0;             //!< all sequences
  index_t loss_sequences = 0;        //!< sequences with at least one trained token: the seq-mean denominator
  index_t microbatches_per_rank = 0; //!< when equal_microbatches, the common count; else the maximum
};

struct step_plan {
  partition ranks_partition{};
  std::vector<rank_plan> ranks{};
  step_totals totals{};
};

//! Plans a step: balances sequences (or whole groups) across ranks, micro-batches every rank
//! with the same count, and computes the global denominators. `loss_tokens` (optional, one per
//! sequence: rollout_batch::loss_token_counts) feeds the trained-token totals.
RLPT_DEFER [[nodiscard]] step_plan plan_step(view<const index_t> lengths, const step_options& o,
                                             view<const index_t> loss_tokens = {}, const groups* grouping = nullptr);

// --- packed output -------------------------------------------------------------------------

struct pack_options {
  index_t pad_to_multiple = 1;   //!< pad the packed length to a multiple (1: none, verl remove_padding; AReaL 256)
  token_id pad_token = 0;        //!< token id of padding
  token_id ignore_target = -100; //!< target where no next token exists (torch cross_entropy ignore_index)
};

//! Sizes of a packed micro-batch: allocate the outputs of pack_into with these.
struct packed_extent {
  index_t tokens = 0;    //!< flat tokens including padding
  index_t sequences = 0; //!< cu_seqlens has sequences + 1 entries (padding counts as one sequence)
  index_t pad_tokens = 0;
};

//! Caller-owned outputs of pack_into; optional ones may be empty views.
struct packed_views {
  view<token_id> tokens;           //!< [extent.tokens]
  view<std::int32_t> cu_seqlens;   //!< [extent.sequences + 1]
  view<std::int32_t> position_ids; //!< [extent.tokens], restart at 0 per sequence
  view<mask_t> loss_mask;          //!< [extent.tokens], 0 on padding
  view<token_id> targets{};        //!< optional [extent.tokens]: next token within the sequence, else ignore_target
  view<float> logprobs{};          //!< optional [extent.tokens]: behaviour logprobs, 0 on padding
  view<policy_version> versions{}; //!< optional [extent.tokens]: -1 on padding
};

//! What pack_into wrote.
struct packed_info {
  index_t tokens = 0;      //!< real tokens (without padding)
  index_t loss_tokens = 0; //!< trained tokens
  index_t sequences = 0;   //!< real sequences
  index_t pad_tokens = 0;
  index_t max_seqlen = 0; //!< longest sequence (flash-attn max_seqlen), padding included
};

RLPT_DEFER [[nodiscard]] packed_extent packed_size(const rollout_batch& batch, view<const index_t> items,
                                                   const pack_options& o = {});

//! Writes records `items` of `batch` packed into `out` (sized by packed_size).
RLPT_DEFER packed_info pack_into(const rollout_batch& batch, view<const index_t> items, const packed_views& out,
                                 const pack_options& o = {});

//! A packed micro-batch that owns its arrays (convenience over pack_into).
struct packed_microbatch {
  std::vector<token_id> tokens{};
  std::vector<std::int32_t> cu_seqlens{};
  std::vector<std::int32_t> position_ids{};
  std::vector<mask_t> loss_mask{};
  std::vector<token_id> targets{};
  std::vector<float> logprobs{};
  std::vector<policy_version> versions{};
  std::vector<index_t> items{}; //!< batch rows, in packed order
  packed_info info{};
};

RLPT_DEFER [[nodiscard]] packed_microbatch pack(const rollout_batch& batch, view<const index_t> items,
                                                const pack_options& o = {});

//! Gathers a per-token column laid out like the batch (offsets: the batch's cu_seqlens,
//! `width` values per token) into packed order; padding slots get `pad`.
//! The offsets are validated as a layout's (start at 0, non-decreasing).
template <class T>
void pack_tokens(view<const index_t> offsets, view<const T> src, index_t width, view<const index_t> items, view<T> dst,
                 T pad = T{}) {
  RLPT_CHECK(width >= 1, errors::rollout::bad_option, "pack_tokens width must be >= 1, got {}", width);
  detail::check_offsets(errors::rollout::bad_items, "pack_tokens offsets", "sequence", offsets);
  const index_t total = offsets[offsets.size() - 1];
  detail::expect_size("src", src.size(),
                      detail::checked_mul(errors::rollout::bad_items, "offsets.back() * width", total, width),
                      "offsets.back() * width");
  index_t at = 0;
  for (index_t k = 0; k < items.size(); ++k) {
    const index_t i = items[k];
    RLPT_CHECK(i >= 0 && i < offsets.size() - 1, errors::rollout::bad_items,
               "item {} (items[{}]) is outside {} sequences", i, k, offsets.size() - 1);
    const index_t n = (offsets[i + 1] - offsets[i]) * width; // <= total * width
    RLPT_CHECK(n <= dst.size() - at, errors::rollout::bad_items,
               "dst of {} elements is too small for the items: items[{}] = {} needs {} more after {}", dst.size(), k, i,
               n, at);
    std::copy_n(src.data() + offsets[i] * width, n, dst.data() + at);
    at += n;
  }
  std::fill(dst.data() + at, dst.data() + dst.size(), pad);
}

//! Expands one value per sequence (e.g. a GRPO advantage) to every token of the packed items;
//! padding slots get `pad`.
template <class T>
void expand_per_sequence(view<const index_t> offsets, view<const T> per_sequence, view<const index_t> items,
                         view<T> dst, T pad = T{}) {
  detail::check_offsets(errors::rollout::bad_items, "expand_per_sequence offsets", "sequence", offsets);
  detail::expect_size("per_sequence", per_sequence.size(), offsets.size() - 1, "one per sequence");
  index_t at = 0;
  for (index_t k = 0; k < items.size(); ++k) {
    const index_t i = items[k];
    RLPT_CHECK(i >= 0 && i < per_sequence.size(), errors::rollout::bad_items,
               "item {} (items[{}]) is outside {} sequences", i, k, per_sequence.size());
    const index_t n = offsets[i + 1] - offsets[i];
    RLPT_CHECK(n <= dst.size() - at, errors::rollout::bad_items,
               "dst of {} elements is too small for the items: items[{}] = {} needs {} more after {}", dst.size(), k, i,
               n, at);
    std::fill_n(dst.data() + at, n, per_sequence[i]);
    at += n;
  }
  std::fill(dst.data() + at, dst.data() + dst.size(), pad);
}

RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN

namespace detail {

RLPT_DEFER RLPT_INLINE std::vector<std::vector<index_t>> first_fit(std::span<const index_t> order,
                                                                   view<const index_t> len, index_t cap) {
  std::size_t size = 1;
  while (size < std::max<std::size_t>(order.size(), 1)) size *= 2;
  std::vector<index_t> tree(2 * size, 0); // free space; unopened bins count as `cap`
  for (std::size_t i = 0; i < size; ++i) tree[size + i] = cap;
  for (std::size_t i = size - 1; i >= 1; --i) tree[i] = std::max(tree[2 * i], tree[2 * i + 1]);
  std::vector<std::vector<index_t>> bins;
  for (const index_t item : order) {
    const index_t need = len[item];
    std::size_t node = 1;
    while (node < size) node = tree[2 * node] >= need ? 2 * node : 2 * node + 1;
    const std::size_t bin = node - size;
    if (bin >= bins.size()) bins.resize(bin + 1);
    bins[bin].push_back(item);
    tree[node] -= need;
    for (node /= 2; node >= 1; node /= 2) tree[node] = std::max(tree[2 * node], tree[2 * node + 1]);
  }
  return bins;
}

RLPT_DEFER RLPT_INLINE std::vector<std::vector<index_t>> ffd(std::span<const index_t> ids, view<const index_t> len,
                                                             index_t cap) {
  std::vector<index_t> order(ids.begin(), ids.end());
  std::sort(order.begin(), order.end(),
            [&](index_t a, index_t b) { return len[a] != len[b] ? len[a] > len[b] : a < b; });
  return first_fit(order, len, cap);
}

RLPT_DEFER RLPT_INLINE bool repair(std::vector<std::vector<index_t>>& bins, view<const index_t> len, index_t cap) {
  std::vector<index_t> tokens(bins.size());
  for (std::size_t b = 0; b < bins.size(); ++b) tokens[b] = tokens_of(bins[b], len);
  for (std::size_t b = 0; b < bins.size(); ++b) {
    if (tokens[b] <= cap) continue;
    auto& over = bins[b];
    std::sort(over.begin(), over.end(),
              [&](index_t x, index_t y) { return len[x] != len[y] ? len[x] > len[y] : x < y; });
    for (std::size_t i = 0; i < over.size() && tokens[b] > cap;) {
      std::size_t roomiest = b;
      for (std::size_t c = 0; c < bins.size(); ++c)
        if (c != b && (roomiest == b || tokens[c] < tokens[roomiest])) roomiest = c;
      const index_t item = over[i];
      if (roomiest == b || tokens[roomiest] + len[item] > cap) {
        ++i; // too big for any other bin: try a smaller one
        continue;
      }
      bins[roomiest].push_back(item);
      tokens[roomiest] += len[item];
      tokens[b] -= len[item];
      over.erase(over.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (tokens[b] > cap) return false;
  }
  return true;
}

RLPT_DEFER RLPT_INLINE void split_to(std::vector<std::vector<index_t>>& bins, index_t want, view<const index_t> len) {
  while (static_cast<index_t>(bins.size()) < want) {
    std::size_t pick = bins.size();
    index_t most = -1;
    for (std::size_t b = 0; b < bins.size(); ++b)
      if (bins[b].size() >= 2 && tokens_of(bins[b], len) > most) {
        most = tokens_of(bins[b], len);
        pick = b;
      }
    if (pick == bins.size()) return;
    std::vector<index_t> items = std::move(bins[pick]);
    std::sort(items.begin(), items.end(),
              [&](index_t a, index_t b) { return len[a] != len[b] ? len[a] > len[b] : a < b; });
    std::vector<index_t> a, b;
    index_t ta = 0, tb = 0;
    for (const index_t i : items) {
      if (ta <= tb) {
        a.push_back(i);
        ta += len[i];
      } else {
        b.push_back(i);
        tb += len[i];
      }
    }
    bins[pick] = std::move(a);
    bins.push_back(std::move(b));
  }
}

} // namespace detail

RLPT_DEFER RLPT_INLINE microbatch_plan plan_microbatches(view<const index_t> lengths, const microbatch_options& o) {
  RLPT_CHECK(o.token_budget >= 1, errors::rollout::bad_option, "token_budget must be >= 1, got {}", o.token_budget);
  RLPT_CHECK(o.min_microbatches >= 0 && o.divisor >= 1 && o.kk_attempts >= 1, errors::rollout::bad_option,
             "min_microbatches ({}) must be >= 0, divisor ({}) and kk_attempts ({}) >= 1", o.min_microbatches,
             o.divisor, o.kk_attempts);
  RLPT_CHECK(o.algorithm == pack_algorithm::karmarkar_karp || o.algorithm == pack_algorithm::ffd ||
                 o.algorithm == pack_algorithm::first_fit,
             errors::rollout::bad_option, "micro-batch algorithm code {} is not a pack_algorithm",
             static_cast<int>(o.algorithm));
  const index_t n = lengths.size();
  detail::check_count(errors::rollout::bad_option, "min_microbatches", o.min_microbatches, n, "sequence");
  detail::check_count(errors::rollout::bad_option, "divisor", o.divisor, n, "sequence");
  static_cast<void>(detail::total_length(lengths));
  std::vector<index_t> regular, big;
  index_t regular_tokens = 0;
  for (index_t i = 0; i < n; ++i) {
    if (lengths[i] > o.token_budget) {
      big.push_back(i);
    } else {
      regular.push_back(i);
      regular_tokens += lengths[i];
    }
  }
  const auto nbig = static_cast<index_t>(big.size());
  const auto nreg = static_cast<index_t>(regular.size());
  // Target count: enough for the tokens, the minimum, and a multiple of the divisor.
  const index_t lower = regular.empty() ? 0 : std::max<index_t>(1, detail::ceil_div(regular_tokens, o.token_budget));
  const index_t want_total = detail::round_up(std::max(lower + nbig, o.min_microbatches), o.divisor);
  index_t k = want_total - nbig; // micro-batches for the regular sequences

  std::vector<std::vector<index_t>> bins;
  microbatch_plan plan;
  if (nreg > 0) {
    bool done = false;
    if (o.algorithm == pack_algorithm::karmarkar_karp) {
      std::vector<double> w(regular.size());
      for (std::size_t i = 0; i < regular.size(); ++i) w[i] = o.cost(lengths[regular[i]]);
      detail::check_weights(w, 1);
      for (index_t attempt = 0; attempt < o.kk_attempts && !done; ++attempt) {
        const index_t kk = std::min(k + attempt * o.divisor, nreg);
        auto parts = detail::karmarkar_karp(w, kk, false);
        bool fits = true;
        for (auto& p : parts) {
          for (auto& i : p) i = regular[static_cast<std::size_t>(i)];
          fits = fits && detail::tokens_of(p, lengths) <= o.token_budget;
        }
        if (!fits && o.repair) fits = detail::repair(parts, lengths, o.token_budget);
        if (fits) {
          bins = std::move(parts);
          done = true;
          k = std::max(k, kk);
        }
        if (kk == nreg) break; // one sequence per micro-batch always fits; larger k adds nothing
      }
      plan.fell_back = !done;
    }
    if (!done) {
      bins = o.algorithm == pack_algorithm::first_fit ? detail::first_fit(regular, lengths, o.token_budget)
                                                      : detail::ffd(regular, lengths, o.token_budget);
      detail::split_to(bins, k, lengths);
    }
    // The count may have grown past the target: keep it a multiple of the divisor.
    const index_t total = detail::round_up(static_cast<index_t>(bins.size()) + nbig, o.divisor);
    detail::split_to(bins, total - nbig, lengths);
  }
  for (const index_t b : big) bins.push_back({b});
  plan.oversize = nbig;
  while (static_cast<index_t>(bins.size()) < want_total || static_cast<index_t>(bins.size()) % o.divisor != 0)
    bins.emplace_back();
  for (auto& b : bins) std::sort(b.begin(), b.end());

  // Order micro-batches: cheap ones at both ends (verl), else by first item.
  std::vector<index_t> order(bins.size());
  std::iota(order.begin(), order.end(), index_t{0});
  std::vector<double> mb_cost(bins.size(), 0.0);
  for (std::size_t b = 0; b < bins.size(); ++b)
    for (const index_t i : bins[b]) mb_cost[b] += o.cost(lengths[i]);
  if (o.small_at_ends) {
    std::vector<index_t> first(bins.size(), 0); // verl's tie key: the first sequence, 0 for an empty one
    for (std::size_t b = 0; b < bins.size(); ++b)
      if (!bins[b].empty()) first[b] = bins[b].front();
    order_small_at_ends(order, mb_cost, ends_order::microbatches, first);
  } else {
    std::sort(order.begin(), order.end(), [&](index_t a, index_t b) {
      const auto& x = bins[static_cast<std::size_t>(a)];
      const auto& y = bins[static_cast<std::size_t>(b)];
      if (x.empty() != y.empty()) return y.empty();
      return x.empty() ? a < b : x.front() < y.front();
    });
  }
  for (const index_t b : order) {
    const auto& bin = bins[static_cast<std::size_t>(b)];
    plan.items.insert(plan.items.end(), bin.begin(), bin.end());
    plan.offsets.push_back(static_cast<index_t>(plan.items.size()));
    plan.tokens.push_back(detail::tokens_of(bin, lengths));
    plan.empty += bin.empty();
  }
  return plan;
}

RLPT_DEFER RLPT_INLINE step_plan plan_step(view<const index_t> lengths, const step_options& o,
                                           view<const index_t> loss_tokens, const groups* grouping) {
  RLPT_CHECK(o.ranks >= 1, errors::rollout::bad_option, "ranks must be >= 1, got {}", o.ranks);
  detail::expect_size_or_empty("loss_tokens", loss_tokens.size(), lengths.size(), "one per sequence");
  static_cast<void>(detail::total_length(lengths)); // every rank's and the step's token total fits
  for (index_t i = 0; i < loss_tokens.size(); ++i)
    RLPT_CHECK(loss_tokens[i] >= 0 && loss_tokens[i] <= lengths[i], errors::rollout::bad_length,
               "loss_tokens[{}] = {} is outside [0, {}] (sequence {} has {} tokens)", i, loss_tokens[i], lengths[i], i,
               lengths[i]);
  RLPT_CHECK(!o.groups_atomic || grouping != nullptr, errors::rollout::bad_option,
             "groups_atomic needs the groups (pass the batch's groups())");
  balance_options b = o.balance;
  b.ranks = o.ranks;
  step_plan plan;
  plan.ranks_partition = o.groups_atomic ? balance_groups(lengths, *grouping, b) : balance(lengths, b);
  const auto k = static_cast<std::size_t>(o.ranks);
  plan.ranks.resize(k);
  std::vector<std::vector<index_t>> local_len(k);
  for (std::size_t r = 0; r < k; ++r) {
    const auto part = plan.ranks_partition.part(static_cast<index_t>(r));
    plan.ranks[r].items.assign(part.begin(), part.end());
    for (const index_t i : part) local_len[r].push_back(lengths[i]);
  }
  microbatch_options mo = o.microbatch;
  std::vector<microbatch_plan> local(k);
  index_t common = mo.min_microbatches;
  for (bool again = true; again;) { // raise the count until every rank agrees (AReaL allocate_balanced_mbs_synced)
    again = false;
    for (std::size_t r = 0; r < k; ++r) {
      if (o.equal_microbatches) mo.min_microbatches = common;
      local[r] = plan_microbatches(local_len[r], mo);
    }
    if (o.equal_microbatches) {
      index_t most = 0;
      for (const auto& p : local) most = std::max(most, p.num_microbatches());
      for (const auto& p : local) again = again || p.num_microbatches() != most;
      common = most;
    }
  }
  for (std::size_t r = 0; r < k; ++r) {
    rank_plan& rp = plan.ranks[r];
    rp.microbatches = std::move(local[r]);
    for (auto& i : rp.microbatches.items) i = rp.items[static_cast<std::size_t>(i)]; // local -> global
    rp.sequences = static_cast<index_t>(rp.items.size());
    for (const index_t i : rp.items) {
      rp.tokens += lengths[i];
      if (!loss_tokens.empty()) {
        rp.loss_tokens += loss_tokens[i];
        plan.totals.loss_sequences += loss_tokens[i] > 0;
      }
    }
    plan.totals.tokens += rp.tokens;
    plan.totals.loss_tokens += rp.loss_tokens;
    plan.totals.sequences += rp.sequences;
    plan.totals.microbatches_per_rank = std::max(plan.totals.microbatches_per_rank, rp.microbatches.num_microbatches());
  }
  return plan;
}

RLPT_DEFER RLPT_INLINE packed_extent packed_size(const rollout_batch& batch, view<const index_t> items,
                                                 const pack_options& o) {
  RLPT_CHECK(o.pad_to_multiple >= 1, errors::rollout::bad_option, "pad_to_multiple must be >= 1, got {}",
             o.pad_to_multiple);
  constexpr index_t int32_max = std::numeric_limits<std::int32_t>::max();
  packed_extent e;
  for (index_t k = 0; k < items.size(); ++k) {
    const index_t i = items[k];
    RLPT_CHECK(i >= 0 && i < batch.size(), errors::rollout::bad_items,
               "item {} (items[{}]) is outside the batch of {} records", i, k, batch.size());
    e.tokens += batch.length(i); // <= int32_max + a record's length: no overflow
    RLPT_CHECK(e.tokens <= int32_max, errors::rollout::bad_items,
               "the packed tokens overflow int32 cu_seqlens: {} tokens after items[{}] = {}, at most {}", e.tokens, k,
               i, int32_max);
  }
  e.sequences = items.size();
  index_t padded = 0;
  RLPT_CHECK(!detail::round_up_overflows(e.tokens, o.pad_to_multiple, padded) && padded <= int32_max,
             errors::rollout::bad_items,
             "{} packed tokens padded to a multiple of pad_to_multiple = {} overflow int32 cu_seqlens (at most {})",
             e.tokens, o.pad_to_multiple, int32_max);
  e.pad_tokens = padded - e.tokens;
  if (e.pad_tokens > 0) ++e.sequences;
  e.tokens = padded;
  return e;
}

RLPT_DEFER RLPT_INLINE packed_info pack_into(const rollout_batch& batch, view<const index_t> items,
                                             const packed_views& out, const pack_options& o) {
  const packed_extent e = packed_size(batch, items, o); // validates items and the int32 bound
  detail::expect_size("tokens", out.tokens.size(), e.tokens, "packed_size().tokens");
  detail::expect_size("cu_seqlens", out.cu_seqlens.size(), e.sequences + 1, "packed_size().sequences + 1");
  detail::expect_size("position_ids", out.position_ids.size(), e.tokens, "packed_size().tokens");
  detail::expect_size("loss_mask", out.loss_mask.size(), e.tokens, "packed_size().tokens");
  detail::expect_size_or_empty("targets", out.targets.size(), e.tokens, "packed_size().tokens");
  detail::expect_size_or_empty("logprobs", out.logprobs.size(), e.tokens, "packed_size().tokens");
  detail::expect_size_or_empty("versions", out.versions.size(), e.tokens, "packed_size().tokens");
  RLPT_CHECK(out.logprobs.empty() || batch.schema().logprobs, errors::rollout::bad_items,
             "logprobs requested but the batch's records carry none");
  RLPT_CHECK(out.versions.empty() || batch.schema().versions, errors::rollout::bad_items,
             "versions requested but the batch's records carry none");
  packed_info info;
  index_t at = 0;
  index_t s = 0;
  out.cu_seqlens[0] = 0;
  const token_id* tokens = batch.tokens().data();
  const mask_t* mask = batch.loss_mask().data();
  for (const index_t i : items) {
    const index_t b = batch.offsets()[i], n = batch.length(i);
    const auto un = static_cast<std::size_t>(n);
    // Column copies are plain memcpy-able ranges; positions and targets are generated.
    std::copy_n(tokens + b, un, out.tokens.data() + at);
    std::copy_n(mask + b, un, out.loss_mask.data() + at);
    if (!out.logprobs.empty()) std::copy_n(batch.logprobs().data() + b, un, out.logprobs.data() + at);
    if (!out.versions.empty()) std::copy_n(batch.versions().data() + b, un, out.versions.data() + at);
    std::int32_t* pos = out.position_ids.data() + at;
    for (index_t t = 0; t < n; ++t) pos[t] = static_cast<std::int32_t>(t);
    if (!out.targets.empty() && n > 0) {
      std::copy_n(tokens + b + 1, un - 1, out.targets.data() + at);
      out.targets[at + n - 1] = o.ignore_target; // labels never cross into the next sequence
    }
    for (index_t t = 0; t < n; ++t) info.loss_tokens += mask[b + t] != 0;
    at += n;
    out.cu_seqlens[++s] = static_cast<std::int32_t>(at);
    info.max_seqlen = std::max(info.max_seqlen, n);
  }
  info.tokens = at;
  info.sequences = items.size();
  for (index_t t = 0; t < e.pad_tokens; ++t) {
    out.tokens[at + t] = o.pad_token;
    out.position_ids[at + t] = static_cast<std::int32_t>(t);
    out.loss_mask[at + t] = 0;
    if (!out.targets.empty()) out.targets[at + t] = o.ignore_target;
    if (!out.logprobs.empty()) out.logprobs[at + t] = 0.0f;
    if (!out.versions.empty()) out.versions[at + t] = no_version;
  }
  if (e.pad_tokens > 0) {
    out.cu_seqlens[++s] = static_cast<std::int32_t>(at + e.pad_tokens);
    info.max_seqlen = std::max(info.max_seqlen, e.pad_tokens);
  }
  info.pad_tokens = e.pad_tokens;
  return info;
}

RLPT_DEFER RLPT_INLINE packed_microbatch pack(const rollout_batch& batch, view<const index_t> items,
                                              const pack_options& o) {
  const packed_extent e = packed_size(batch, items, o);
  packed_microbatch m;
  const auto nt = static_cast<std::size_t>(e.tokens);
  m.tokens.resize(nt);
  m.cu_seqlens.resize(static_cast<std::size_t>(e.sequences) + 1);
  m.position_ids.resize(nt);
  m.loss_mask.resize(nt);
  m.targets.resize(nt);
  if (batch.schema().logprobs) m.logprobs.resize(nt);
  if (batch.schema().versions) m.versions.resize(nt);
  m.items.assign(items.begin(), items.end());
  m.info = pack_into(batch, items,
                     {m.tokens, m.cu_seqlens, m.position_ids, m.loss_mask, m.targets, m.logprobs, m.versions}, o);
  return m;
}

RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
