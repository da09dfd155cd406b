// SPDX-License-Identifier: Apache-2.0
//! @file
//! Receiver-side transforms as data: rename, concatenate (q/k/v -> qkv, gate/up -> gate_up),
//! slice, dtype cast and drop, compiled once against a manifest and applied on the way to the
//! user's load callback (how vLLM's `load_weights` and SGLang's receivers consume weights).
//!
//! Names may hold one `*`, matching any substring; the same capture is substituted into the
//! other names of the rule, so one rule covers every layer:
//!
//!     rlpt::sync::concat{.inputs = {"*.q_proj.weight", "*.k_proj.weight", "*.v_proj.weight"},
//!                        .output = "*.qkv_proj.weight"}
//!
//! Rules run in order over the current tensor list; a rule that matches nothing is an error
//! (a typo would otherwise silently skip a weight). Mapping mistakes are the most common
//! source of corrupted weights after sync, so these are checked data, not user code paths.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/dtype.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/core/format.hpp>
#include <rlpt/sync/dtype.hpp>
#include <rlpt/sync/manifest.hpp>

#include <fmt/core.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

RLPT_NAMESPACE_BEGIN
namespace sync {

//! A tensor handed to the load callback: name, dtype, shape and row-major host bytes.
//! The bytes are valid only during the callback.
struct tensor_view {
  std::string_view name;
  wire_dtype dtype = wire_dtype::f32;
  std::span<const std::int64_t> shape;
  std::span<const std::byte> bytes;
};

//! The receiver's load callback (vLLM `model.load_weights([(name, tensor)])` style).
using load_fn = std::function<void(const tensor_view&)>;

//! Renames every tensor matching `from` (an exact name or a pattern with one `*`).
struct rename_tensor {
  std::string from{};
  std::string to{};
};
//! Concatenates `inputs` (same dtype, same shape but along `dim`) into `output`.
struct concat {
  std::vector<std::string> inputs{};
  std::string output{};
  std::int64_t dim = 0;
};
//! Keeps [begin, end) of dimension `dim` (a tensor-parallel shard, a vocab trim). The slice
//! replaces the input; `output` renames it (empty: same name).
struct slice {
  std::string input{};
  std::string output{};
  std::int64_t dim = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};
//! Converts matching floating tensors (f32, f64, f16, bf16) to `to`, rounding to nearest even.
struct cast {
  std::string pattern = "*";
  wire_dtype to = wire_dtype::bf16;
};
//! Removes matching tensors (weights the engine does not have).
struct drop {
  std::string pattern{};
};

using transform = std::variant<rename_tensor, concat, slice, cast, drop>;

namespace detail {

//! Matches `name` against a pattern with at most one `*`; returns the capture.
[[nodiscard]] inline std::optional<std::string_view> match(std::string_view pattern, std::string_view name) {
  const auto star = pattern.find('*');
  if (star == std::string_view::npos) return pattern == name ? std::optional<std::string_view>("") : std::nullopt;
  const std::string_view pre = pattern.substr(0, star), post = pattern.substr(star + 1);
  if (name.size() < pre.size() + post.size() || name.substr(0, pre.size()) != pre ||
      name.substr(name.size() - post.size()) != post)
    return std::nullopt;
  return name.substr(pre.size(), name.size() - pre.size() - post.size());
}

[[nodiscard]] inline std::string substitute(std::string_view pattern, std::string_view capture) {
  const auto star = pattern.find('*');
  if (star == std::string_view::npos) return std::string(pattern);
  return rlpt::detail::format("{}{}{}", pattern.substr(0, star), capture, pattern.substr(star + 1));
}

inline void check_pattern(std::string_view p, std::string_view rule) {
  RLPT_CHECK(std::count(p.begin(), p.end(), '*') <= 1, errors::sync::bad_transform,
             "{}: pattern \"{}\" has more than one '*'", rule, p);
}

inline bool is_float_wire(wire_dtype t) noexcept {
  return t == wire_dtype::f32 || t == wire_dtype::f64 || t == wire_dtype::f16 || t == wire_dtype::bf16;
}

inline double load_float(wire_dtype t, const std::byte* p) noexcept {
  switch (t) {
  case wire_dtype::f64: {
    double v;
    std::memcpy(&v, p, 8);
    return v;
  }
  case wire_dtype::f32: {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  case wire_dtype::f16: {
    std::uint16_t b;
    std::memcpy(&b, p, 2);
    return static_cast<double>(static_cast<float>(f16::from_bits(b)));
  }
  default: {
    std::uint16_t b;
    std::memcpy(&b, p, 2);
    return static_cast<double>(static_cast<float>(bf16::from_bits(b)));
  }
  }
}

inline void store_float(wire_dtype t, std::byte* p, double v) noexcept {
  switch (t) {
  case wire_dtype::f64:
    std::memcpy(p, &v, 8);
    break;
  case wire_dtype::f32: {
    const auto f = static_cast<float>(v);
    std::memcpy(p, &f, 4);
    break;
  }
  case wire_dtype::f16: {
    const std::uint16_t b = f16(static_cast<float>(v)).bits;
    std::memcpy(p, &b, 2);
    break;
  }
  default: {
    const std::uint16_t b = bf16(static_cast<float>(v)).bits;
    std::memcpy(p, &b, 2);
    break;
  }
  }
}

inline std::uint64_t prod(std::span<const std::int64_t> s, std::size_t from, std::size_t to) noexcept {
  std::uint64_t n = 1;
  for (std::size_t i = from; i < to; ++i) n *= static_cast<std::uint64_t>(s[i]);
  return n;
}

} // namespace detail

//! Transforms compiled against one manifest layout.
template <class = void> class basic_transform_plan {
public:
  enum class op : std::uint8_t { source, concat, slice, cast };
  struct node {
    op kind = op::source;
    std::size_t tensor = 0;          //!< manifest index (source)
    std::vector<std::size_t> inputs; //!< node indices (concat: several; slice/cast: one)
    std::int64_t dim = 0, begin = 0, end = 0;
    wire_dtype dtype = wire_dtype::f32;
    std::vector<std::int64_t> shape;
    std::uint64_t nbytes = 0;
  };
  struct output {
    std::string name;
    std::size_t node = 0;
    std::vector<std::size_t> sources; //!< manifest tensors it reads, ascending
  };

  basic_transform_plan() = default;

  basic_transform_plan(const manifest& m, std::initializer_list<transform> rules)
      : basic_transform_plan(m, std::span<const transform>(rules.begin(), rules.size())) {}

  basic_transform_plan(const manifest& m, std::span<const transform> rules);

  [[nodiscard]] std::span<const output> outputs() const noexcept { return outputs_; }
  [[nodiscard]] const node& node_at(std::size_t k) const noexcept { return nodes_[k]; }
  //! Outputs that read manifest tensor `tensor`.
  [[nodiscard]] std::span<const std::size_t> outputs_of(std::size_t tensor) const noexcept {
    return by_tensor_[tensor];
  }
  [[nodiscard]] bool identity() const noexcept { return identity_; }

  //! Evaluates output `k`: `source(i)` returns manifest tensor i's bytes; `load` gets the result.
  template <class Source> void run(std::size_t k, Source&& source, const load_fn& load) const {
    const output& o = outputs_[k];
    std::vector<std::vector<std::byte>> temps;
    const std::span<const std::byte> bytes = eval(o.node, source, temps);
    const node& n = nodes_[o.node];
    load(tensor_view{o.name, n.dtype, n.shape, bytes});
  }

private:
  static std::string describe(const transform& t);

  template <class Cur> static void check_unique(const std::vector<Cur>& cur, std::string_view rule) {
    std::vector<std::string_view> names;
    names.reserve(cur.size());
    for (const auto& c : cur) names.push_back(c.name);
    std::sort(names.begin(), names.end());
    const auto dup = std::adjacent_find(names.begin(), names.end());
    RLPT_CHECK(dup == names.end(), errors::sync::bad_transform, "{} produces two tensors named \"{}\"", rule,
               dup == names.end() ? std::string_view{} : *dup);
  }

  std::size_t add_concat(const std::vector<std::size_t>& ins, const std::vector<std::string>& names, std::int64_t dim,
                         std::string_view rule);

  std::size_t add_slice(std::size_t in, const std::string& nm, std::int64_t dim, std::int64_t begin, std::int64_t end,
                        std::string_view rule);

  void collect_sources(std::size_t k, std::vector<std::size_t>& out) const;

  template <class Source>
  std::span<const std::byte> eval(std::size_t k, Source& source, std::vector<std::vector<std::byte>>& temps) const {
    const node& n = nodes_[k];
    if (n.kind == op::source) return source(n.tensor);
    std::vector<std::span<const std::byte>> ins;
    for (auto i : n.inputs) ins.push_back(eval(i, source, temps));
    temps.emplace_back(static_cast<std::size_t>(n.nbytes));
    std::byte* out = temps.back().data();
    const std::size_t eb = size_of(n.dtype);
    switch (n.kind) {
    case op::concat: {
      const auto d = static_cast<std::size_t>(n.dim);
      const std::uint64_t outer = detail::prod(n.shape, 0, d);
      const std::uint64_t inner = detail::prod(n.shape, d + 1, n.shape.size()) * eb;
      std::uint64_t at = 0;
      for (std::uint64_t o = 0; o < outer; ++o)
        for (std::size_t i = 0; i < ins.size(); ++i) {
          const std::uint64_t row = static_cast<std::uint64_t>(nodes_[n.inputs[i]].shape[d]) * inner;
          if (row) std::memcpy(out + at, ins[i].data() + o * row, static_cast<std::size_t>(row));
          at += row;
        }
      break;
    }
    case op::slice: {
      const auto d = static_cast<std::size_t>(n.dim);
      const node& a = nodes_[n.inputs[0]];
      const std::uint64_t outer = detail::prod(a.shape, 0, d);
      const std::uint64_t inner = detail::prod(a.shape, d + 1, a.shape.size()) * eb;
      const std::uint64_t in_row = static_cast<std::uint64_t>(a.shape[d]) * inner;
      const std::uint64_t out_row = static_cast<std::uint64_t>(n.end - n.begin) * inner;
      for (std::uint64_t o = 0; o < outer; ++o)
        if (out_row)
          std::memcpy(out + o * out_row, ins[0].data() + o * in_row + static_cast<std::uint64_t>(n.begin) * inner,
                      static_cast<std::size_t>(out_row));
      break;
    }
    case op::cast: {
      const wire_dtype from = nodes_[n.inputs[0]].dtype;
      const std::size_t fb = size_of(from);
      const std::uint64_t count = n.nbytes / eb;
      for (std::uint64_t i = 0; i < count; ++i)
        detail::store_float(n.dtype, out + i * eb, detail::load_float(from, ins[0].data() + i * fb));
      break;
    }
    case op::source:
      break;
    }
    return temps.back();
  }

  std::vector<node> nodes_;
  std::vector<output> outputs_;
  std::vector<std::vector<std::size_t>> by_tensor_;
  bool identity_ = true;
};
using transform_plan = basic_transform_plan<>;
RLPT_EXTERN_TEMPLATE(class basic_transform_plan<>)

} // namespace sync
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync {

template <class Tag>
RLPT_INLINE basic_transform_plan<Tag>::basic_transform_plan(const manifest& m, std::span<const transform> rules) {
  struct cur_t {
    std::string name;
    std::size_t node = 0;
  };
  std::vector<cur_t> cur;
  for (std::size_t i = 0; i < m.size(); ++i) {
    node n;
    n.tensor = i;
    n.dtype = m[i].dtype;
    n.shape = m[i].shape;
    n.nbytes = m[i].nbytes;
    nodes_.push_back(std::move(n));
    cur.push_back({m[i].name, i});
  }
  auto find = [&](std::string_view nm) -> std::ptrdiff_t {
    for (std::size_t k = 0; k < cur.size(); ++k)
      if (cur[k].name == nm) return static_cast<std::ptrdiff_t>(k);
    return -1;
  };
  for (std::size_t r = 0; r < rules.size(); ++r) {
    const std::string rule = rlpt::detail::format("transform #{}", r);
    std::size_t hits = 0;
    if (const auto* rn = std::get_if<rename_tensor>(&rules[r])) {
      detail::check_pattern(rn->from, rule);
      detail::check_pattern(rn->to, rule);
      std::vector<std::pair<std::size_t, std::string>> moves;
      for (std::size_t k = 0; k < cur.size(); ++k)
        if (auto c = detail::match(rn->from, cur[k].name)) moves.emplace_back(k, detail::substitute(rn->to, *c));
      hits = moves.size();
      for (auto& [k, to] : moves) {
        const auto clash = find(to);
        RLPT_CHECK(clash < 0 || moves.end() != std::find_if(moves.begin(), moves.end(),
                                                            [&](const auto& mv) {
                                                              return static_cast<std::ptrdiff_t>(mv.first) == clash;
                                                            }),
                   errors::sync::bad_transform,
                   "{} (rename \"{}\" -> \"{}\") renames \"{}\" to \"{}\", which already exists", rule, rn->from,
                   rn->to, cur[k].name, to);
      }
      for (auto& [k, to] : moves) cur[k].name = to;
      check_unique(cur, rule);
    } else if (const auto* cc = std::get_if<concat>(&rules[r])) {
      RLPT_CHECK(!cc->inputs.empty(), errors::sync::bad_transform, "{} (concat -> \"{}\") has no inputs", rule,
                 cc->output);
      for (const auto& p : cc->inputs) detail::check_pattern(p, rule);
      detail::check_pattern(cc->output, rule);
      std::vector<std::pair<std::string, std::string>> firsts; // (name, capture) of matches at rule start
      for (const auto& c : cur)
        if (auto cap = detail::match(cc->inputs[0], c.name)) firsts.emplace_back(c.name, std::string(*cap));
      for (const auto& [first_name, capture] : firsts) {
        if (find(first_name) < 0) continue; // consumed by an earlier match of this rule
        std::vector<std::size_t> in_nodes;
        std::vector<std::string> in_names;
        for (const auto& p : cc->inputs) {
          const std::string nm = detail::substitute(p, capture);
          const auto at = find(nm);
          RLPT_CHECK(at >= 0, errors::sync::bad_transform, "{} (concat -> \"{}\"): input \"{}\" does not exist", rule,
                     detail::substitute(cc->output, capture), nm);
          in_nodes.push_back(cur[static_cast<std::size_t>(at)].node);
          in_names.push_back(nm);
        }
        for (std::size_t a = 0; a < in_names.size(); ++a)
          for (std::size_t b = a + 1; b < in_names.size(); ++b)
            RLPT_CHECK(in_names[a] != in_names[b], errors::sync::bad_transform, "{}: concat lists \"{}\" twice", rule,
                       in_names[a]);
        const std::size_t out = add_concat(in_nodes, in_names, cc->dim, rule);
        const std::string out_name = detail::substitute(cc->output, capture);
        // The output takes the place of the first input; the other inputs go.
        std::size_t first = cur.size();
        for (const auto& nm : in_names) first = std::min(first, static_cast<std::size_t>(find(nm)));
        const std::string keep = cur[first].name;
        for (const auto& nm : in_names)
          if (nm != keep) cur.erase(cur.begin() + find(nm));
        cur[static_cast<std::size_t>(find(keep))] = {out_name, out};
        ++hits;
        check_unique(cur, rule);
      }
    } else if (const auto* sl = std::get_if<slice>(&rules[r])) {
      detail::check_pattern(sl->input, rule);
      detail::check_pattern(sl->output, rule);
      for (auto& c : cur) {
        auto cap = detail::match(sl->input, c.name);
        if (!cap) continue;
        const std::string out_name = sl->output.empty() ? c.name : detail::substitute(sl->output, *cap);
        c.node = add_slice(c.node, c.name, sl->dim, sl->begin, sl->end, rule);
        c.name = out_name;
        ++hits;
      }
      check_unique(cur, rule);
    } else if (const auto* ca = std::get_if<cast>(&rules[r])) {
      detail::check_pattern(ca->pattern, rule);
      RLPT_CHECK(detail::is_float_wire(ca->to), errors::sync::bad_transform,
                 "{} (cast \"{}\" -> {}): casts go to F32, F64, F16 or BF16", rule, ca->pattern, ca->to);
      for (auto& c : cur) {
        if (!detail::match(ca->pattern, c.name)) continue;
        ++hits;
        const node& src = nodes_[c.node];
        if (src.dtype == ca->to) continue;
        RLPT_CHECK(detail::is_float_wire(src.dtype), errors::sync::bad_transform,
                   "{} (cast \"{}\" -> {}) matches \"{}\" of dtype {}, which is not floating", rule, ca->pattern,
                   ca->to, c.name, src.dtype);
        node n;
        n.kind = op::cast;
        n.inputs = {c.node};
        n.dtype = ca->to;
        n.shape = src.shape;
        n.nbytes = src.nbytes / size_of(src.dtype) * size_of(ca->to);
        nodes_.push_back(std::move(n));
        c.node = nodes_.size() - 1;
      }
    } else if (const auto* dr = std::get_if<drop>(&rules[r])) {
      detail::check_pattern(dr->pattern, rule);
      const auto before = cur.size();
      std::erase_if(cur, [&](const cur_t& c) { return detail::match(dr->pattern, c.name).has_value(); });
      hits = before - cur.size();
    }
    RLPT_CHECK(hits > 0, errors::sync::bad_transform, "{} ({}) matches no tensor", rule, describe(rules[r]));
  }
  identity_ = rules.empty();
  by_tensor_.assign(m.size(), {});
  for (const auto& c : cur) {
    output o{c.name, c.node, {}};
    collect_sources(c.node, o.sources);
    std::sort(o.sources.begin(), o.sources.end());
    o.sources.erase(std::unique(o.sources.begin(), o.sources.end()), o.sources.end());
    for (auto s : o.sources) by_tensor_[s].push_back(outputs_.size());
    outputs_.push_back(std::move(o));
  }
}

template <class Tag> RLPT_INLINE std::string basic_transform_plan<Tag>::describe(const transform& t) {
  if (const auto* x = std::get_if<rename_tensor>(&t))
    return rlpt::detail::format("rename \"{}\" -> \"{}\"", x->from, x->to);
  if (const auto* x = std::get_if<concat>(&t))
    return rlpt::detail::format("concat [{}] -> \"{}\"", rlpt::detail::joined(x->inputs, ", "), x->output);
  if (const auto* x = std::get_if<slice>(&t))
    return rlpt::detail::format("slice \"{}\" dim {} [{}, {})", x->input, x->dim, x->begin, x->end);
  if (const auto* x = std::get_if<cast>(&t)) return rlpt::detail::format("cast \"{}\" -> {}", x->pattern, x->to);
  return rlpt::detail::format("drop \"{}\"", std::get<drop>(t).pattern);
}

template <class Tag>
RLPT_INLINE std::size_t basic_transform_plan<Tag>::add_concat(const std::vector<std::size_t>& ins,
                                                              const std::vector<std::string>& names, std::int64_t dim,
                                                              std::string_view rule) {
  const node& a = nodes_[ins[0]];
  const auto rank = static_cast<std::int64_t>(a.shape.size());
  const std::int64_t d = dim < 0 ? dim + rank : dim;
  RLPT_CHECK(d >= 0 && d < rank, errors::sync::bad_transform, "{}: concat dim {} is out of range for \"{}\" of rank {}",
             rule, dim, names[0], rank);
  node n;
  n.kind = op::concat;
  n.inputs = ins;
  n.dim = d;
  n.dtype = a.dtype;
  n.shape = a.shape;
  n.shape[static_cast<std::size_t>(d)] = 0;
  for (std::size_t i = 0; i < ins.size(); ++i) {
    const node& b = nodes_[ins[i]];
    RLPT_CHECK(b.dtype == a.dtype, errors::sync::bad_transform,
               "{}: concat inputs \"{}\" ({}) and \"{}\" ({}) differ in dtype", rule, names[0], a.dtype, names[i],
               b.dtype);
    bool ok = b.shape.size() == a.shape.size();
    for (std::size_t j = 0; ok && j < a.shape.size(); ++j)
      ok = j == static_cast<std::size_t>(d) || a.shape[j] == b.shape[j];
    RLPT_CHECK(ok, errors::sync::bad_transform, "{}: concat inputs \"{}\" [{}] and \"{}\" [{}] differ outside dim {}",
               rule, names[0], rlpt::detail::joined(a.shape, ", "), names[i], rlpt::detail::joined(b.shape, ", "), d);
    n.shape[static_cast<std::size_t>(d)] += b.shape[static_cast<std::size_t>(d)];
    n.nbytes += b.nbytes;
  }
  nodes_.push_back(std::move(n));
  return nodes_.size() - 1;
}

template <class Tag>
RLPT_INLINE std::size_t basic_transform_plan<Tag>::add_slice(std::size_t in, const std::string& nm, std::int64_t dim,
                                                             std::int64_t begin, std::int64_t end,
                                                             std::string_view rule) {
  const node& a = nodes_[in];
  const auto rank = static_cast<std::int64_t>(a.shape.size());
  const std::int64_t d = dim < 0 ? dim + rank : dim;
  RLPT_CHECK(d >= 0 && d < rank, errors::sync::bad_transform, "{}: slice dim {} is out of range for \"{}\" of rank {}",
             rule, dim, nm, rank);
  const std::int64_t size = a.shape[static_cast<std::size_t>(d)];
  RLPT_CHECK(begin >= 0 && begin <= end && end <= size, errors::sync::bad_transform,
             "{}: slice [{}, {}) is outside dim {} of \"{}\" (size {})", rule, begin, end, d, nm, size);
  node n;
  n.kind = op::slice;
  n.inputs = {in};
  n.dim = d;
  n.begin = begin;
  n.end = end;
  n.dtype = a.dtype;
  n.shape = a.shape;
  n.shape[static_cast<std::size_t>(d)] = end - begin;
  n.nbytes = size == 0 ? 0 : a.nbytes / static_cast<std::uint64_t>(size) * static_cast<std::uint64_t>(end - begin);
  nodes_.push_back(std::move(n));
  return nodes_.size() - 1;
}

template <class Tag>
RLPT_INLINE void basic_transform_plan<Tag>::collect_sources(std::size_t k, std::vector<std::size_t>& out) const {
  const node& n = nodes_[k];
  if (n.kind == op::source) {
    out.push_back(n.tensor);
    return;
  }
  for (auto i : n.inputs) collect_sources(i, out);
}

} // namespace sync
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
