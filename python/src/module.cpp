// SPDX-License-Identifier: Apache-2.0
// rlpt._C: loads the operator library (torch.ops.rlpt.*, registered by the other translation
// units of this module) and exposes the helpers that are not tensor ops: copy statistics, strict
// mode, option-string validation, the weight-sync sender / receiver (sync.cpp) and rank balancing
// and micro-batch plans (rollout.cpp).
#include "objective_call.hpp"
#include "spec.hpp"
#include "tensors.hpp"

#include <torch/extension.h>

#ifndef RLPT_PY_TORCH_VERSION
#define RLPT_PY_TORCH_VERSION "unknown"
#endif

namespace rlpt_py {
void bind_sync(pybind11::module_& m);
void bind_rollout(pybind11::module_& m);
bool cuda_kernels_built();
bool lm_head_built();
std::string lm_head_isa(const std::string& want);
} // namespace rlpt_py

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "rlpt operator library and helpers; use the rlpt package, not this module";
  m.attr("torch_version") = RLPT_PY_TORCH_VERSION;
  m.attr("cuda") = rlpt_py::cuda_kernels_built();
  m.attr("lm_head") = rlpt_py::lm_head_built();
  if (rlpt_py::lm_head_built())
    m.def(
        "lm_head_isa",
        [](const std::string& want) { return rlpt_py::guard([&] { return rlpt_py::lm_head_isa(want); }); },
        py::arg("want") = "");
  m.attr("num_metrics") = rlpt_py::num_metrics;
  m.attr("num_mismatch_metrics") = rlpt_py::mismatch_fields;
  m.def("set_strict", &rlpt_py::set_strict, py::arg("on"));
  m.def("strict", &rlpt_py::strict);
  m.def("copy_stats", &rlpt_py::copy_stats);
  m.def("reset_copy_stats", &rlpt_py::reset_copy_stats);
  m.def("describe_objective", [](const std::string& spec) {
    return rlpt_py::guard([&] {
      std::string d;
      (void)rlpt_py::objective_from_spec(spec, &d);
      return d;
    });
  });
  m.def("check_spec", [](const std::string& kind, const std::string& spec) {
    rlpt_py::guard([&] {
      if (kind == "outcome")
        (void)rlpt_py::outcome_from_spec(spec);
      else if (kind == "gae")
        (void)rlpt_py::gae_from_spec(spec);
      else if (kind == "reinforce_pp")
        (void)rlpt_py::reinforce_pp_from_spec(spec);
      else if (kind == "reinforce_pp_baseline")
        (void)rlpt_py::reinforce_baseline_from_spec(spec);
      else if (kind == "remax")
        (void)rlpt_py::remax_from_spec(spec);
      else
        rlpt_py::raise(rlpt_py::ids::bad_option, "unknown spec kind " + kind);
      return 0;
    });
  });
  rlpt_py::bind_sync(m);
  rlpt_py::bind_rollout(m);
}
