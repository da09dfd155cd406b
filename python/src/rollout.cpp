// SPDX-License-Identifier: Apache-2.0
// rlpt._C rank balancing and micro-batch plans (rlpt/rollout/balance.hpp, packing.hpp) for
// rlpt.balance_partitions / rlpt.balance / rlpt.plan_microbatches and rlpt.verl's
// get_seqlen_balanced_partitions. Inputs are 1-D CPU tensors (rlpt/_rollout.py converts lists);
// parts come back as lists of Python ints, built without a tensor round trip.
#include "spec.hpp"
#include "tensors.hpp"

#include <torch/extension.h>

#include <rlpt/rollout/balance.hpp>
#include <rlpt/rollout/compat.hpp>
#include <rlpt/rollout/packing.hpp>

#include <fmt/format.h>

#include <optional>
#include <string>

namespace py = pybind11;

namespace rlpt_py {

namespace {

rlpt::partition_algorithm algorithm_of(const std::string& a) {
  if (a == "karmarkar_karp") return rlpt::partition_algorithm::karmarkar_karp;
  if (a == "lpt") return rlpt::partition_algorithm::lpt;
  if (a == "best") return rlpt::partition_algorithm::best;
  raise(ids::bad_option, fmt::format("algorithm \"{}\" is not one of karmarkar_karp, lpt, best", a));
}

rlpt::pack_algorithm pack_algorithm_of(const std::string& a) {
  if (a == "karmarkar_karp") return rlpt::pack_algorithm::karmarkar_karp;
  if (a == "ffd") return rlpt::pack_algorithm::ffd;
  if (a == "first_fit") return rlpt::pack_algorithm::first_fit;
  raise(ids::bad_option, fmt::format("algorithm \"{}\" is not one of karmarkar_karp, ffd, first_fit", a));
}

//! A 1-D CPU tensor as a contiguous `want` (lists were made tensors by the caller).
at::Tensor vector_input(const at::Tensor& t, at::ScalarType want, std::string_view what) {
  if (t.dim() != 1) raise(ids::shape, fmt::format("{} must be 1-D, got shape {}", what, dims(t.sizes())));
  expect_device(t, c10::Device(c10::kCPU), what);
  return contiguous_as(t, want, what);
}

//! [[items of part 0], [items of part 1], ...] from offsets into items.
py::list lists_of(const std::vector<index_t>& offsets, const std::vector<index_t>& items) {
  const std::size_t parts = offsets.size() - 1;
  py::list out(parts);
  for (std::size_t p = 0; p < parts; ++p) {
    const auto b = static_cast<std::size_t>(offsets[p]), e = static_cast<std::size_t>(offsets[p + 1]);
    py::list part(e - b);
    for (std::size_t i = b; i < e; ++i) PyList_SET_ITEM(part.ptr(), i - b, PyLong_FromLongLong(items[i]));
    out[p] = std::move(part);
  }
  return out;
}

py::tuple partition_tuple(const rlpt::partition& p) { return py::make_tuple(lists_of(p.offsets, p.items), p.loads); }

rlpt::balance_options balance_preset(const std::string& preset, index_t ranks) {
  if (preset == "rlpt") return {.ranks = ranks};
  if (preset == "verl") return rlpt::compat::verl::balance(ranks);
  if (preset == "areal") return rlpt::compat::areal::balance(ranks);
  if (preset == "slime") return rlpt::compat::slime::balance(ranks);
  if (preset == "trl") return rlpt::compat::trl::balance(ranks);
  raise(ids::bad_option, fmt::format("balance preset \"{}\" is not one of rlpt, verl, areal, slime, trl", preset));
}

rlpt::microbatch_options microbatch_preset(const std::string& preset, index_t budget) {
  if (preset == "rlpt") return {.token_budget = budget};
  if (preset == "verl") return rlpt::compat::verl::microbatches(budget);
  if (preset == "areal") return rlpt::compat::areal::microbatches(budget);
  if (preset == "slime") return rlpt::compat::slime::microbatches(budget);
  raise(ids::bad_option, fmt::format("micro-batch preset \"{}\" is not one of rlpt, verl, areal, slime", preset));
}

//! A cost model from (linear, quadratic): cost(L) = linear * L + quadratic * L^2.
void set_cost(rlpt::cost_model& c, const std::optional<std::pair<double, double>>& cost) {
  if (cost) c = {cost->first, cost->second, {}};
}

} // namespace

void bind_rollout(py::module_& m) {
  m.def("partition_weights", [](const at::Tensor& weights, int64_t parts, const std::string& algorithm,
                                bool equal_count, bool refine) {
    const at::Tensor w = vector_input(weights, at::kDouble, "weights");
    const rlpt::partition p = guard([&] {
      return rlpt::partition_weights(view_of<const double>(w), parts, algorithm_of(algorithm), equal_count, refine);
    });
    return partition_tuple(p);
  });
  m.def("balance", [](const at::Tensor& lengths, int64_t ranks, const std::string& preset,
                      const std::optional<std::string>& algorithm, std::optional<bool> equal_count,
                      std::optional<bool> refine, const std::optional<std::pair<double, double>>& cost) {
    const at::Tensor l = vector_input(lengths, at::kLong, "lengths");
    const rlpt::partition p = guard([&] {
      rlpt::balance_options o = balance_preset(preset, ranks);
      if (algorithm) o.algorithm = algorithm_of(*algorithm);
      if (equal_count) o.equal_count = *equal_count;
      if (refine) o.refine = *refine;
      set_cost(o.cost, cost);
      return rlpt::balance(view_of<const index_t>(l), o);
    });
    return partition_tuple(p);
  });
  m.def("plan_microbatches", [](const at::Tensor& lengths, int64_t token_budget, const std::string& preset,
                                const std::optional<std::string>& algorithm, std::optional<int64_t> min_microbatches,
                                std::optional<int64_t> divisor, std::optional<bool> small_at_ends,
                                const std::optional<std::pair<double, double>>& cost) {
    const at::Tensor l = vector_input(lengths, at::kLong, "lengths");
    const rlpt::microbatch_plan p = guard([&] {
      rlpt::microbatch_options o = microbatch_preset(preset, token_budget);
      if (algorithm) o.algorithm = pack_algorithm_of(*algorithm);
      if (min_microbatches) o.min_microbatches = *min_microbatches;
      if (divisor) o.divisor = *divisor;
      if (small_at_ends) o.small_at_ends = *small_at_ends;
      set_cost(o.cost, cost);
      return rlpt::plan_microbatches(view_of<const index_t>(l), o);
    });
    py::dict d;
    d["microbatches"] = lists_of(p.offsets, p.items);
    d["tokens"] = p.tokens;
    d["oversize"] = p.oversize;
    d["empty"] = p.empty;
    d["fell_back"] = p.fell_back;
    return d;
  });
}

} // namespace rlpt_py
