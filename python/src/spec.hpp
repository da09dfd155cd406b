// SPDX-License-Identifier: Apache-2.0
// Option strings of the rlpt Python ops: "key=value;key=value". Torch custom operators take
// strings as constants (torch.compile bakes them into the graph), so an objective or an
// estimator travels as one string that C++ turns into rlpt's option structs. Unknown keys and
// unparsable values raise rlpt::error ("rlpt.python.bad_option"), never pass silently.
#pragma once

#include <rlpt/advantage.hpp>
#include <rlpt/objective.hpp>

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace rlpt_py {

//! Ids of the errors the binding itself raises (rlpt's own ids are in rlpt/core/error_ids.hpp).
namespace ids {
inline constexpr std::string_view bad_option = "rlpt.python.bad_option";
inline constexpr std::string_view strides = "rlpt.python.strides";
inline constexpr std::string_view dtype = "rlpt.python.dtype";
inline constexpr std::string_view shape = "rlpt.python.shape";
inline constexpr std::string_view device = "rlpt.python.device";
} // namespace ids

[[noreturn]] void raise(std::string_view id, const std::string& message);

//! A parsed option string. Every key must be read (finish() names the ones that were not).
class spec {
public:
  spec(std::string_view text, std::string_view who);

  [[nodiscard]] bool has(std::string_view key) const;
  [[nodiscard]] std::optional<std::string> str(std::string_view key);
  [[nodiscard]] std::optional<double> num(std::string_view key);
  [[nodiscard]] std::optional<bool> flag(std::string_view key);
  //! A number, or nullopt for the literal "none".
  [[nodiscard]] std::optional<std::optional<double>> num_or_none(std::string_view key);

  template <class T> void get(std::string_view key, T& out) {
    if constexpr (std::is_same_v<T, bool>) {
      if (auto v = flag(key)) out = *v;
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (auto v = str(key)) out = *v;
    } else if constexpr (std::is_same_v<T, std::optional<double>>) {
      if (auto v = num_or_none(key)) out = *v;
    } else if constexpr (std::is_same_v<T, std::optional<int>>) {
      if (auto v = num_or_none(key)) out = v->has_value() ? std::optional<int>(static_cast<int>(**v)) : std::nullopt;
    } else {
      if (auto v = num(key)) out = static_cast<T>(*v);
    }
  }
  void finish() const;
  [[nodiscard]] const std::string& who() const { return who_; }

private:
  std::map<std::string, std::string, std::less<>> kv_;
  std::map<std::string, bool, std::less<>> used_;
  std::string who_;
};

//! The objective an option string describes: "preset=verl_actor;loss_mode=gspo;..." (the
//! framework's own option names, through rlpt::compat) or "preset=custom;policy=ppo_clip;..."
//! (rlpt's structs, key = member path). Followed by common keys: nonfinite, global_tokens,
//! global_seqs. Returns the description used in messages.
rlpt::objective objective_from_spec(std::string_view text, std::string* description = nullptr);

//! Estimator options from strings (see rlpt/_spec.py for the keys).
struct outcome_options {
  std::string estimator;
  rlpt::grpo_options grpo;
  rlpt::rloo_options rloo;
  rlpt::opo_options opo;
  rlpt::gpg_options gpg;
  rlpt::passk_options passk;
};
outcome_options outcome_from_spec(std::string_view text);
rlpt::gae_options gae_from_spec(std::string_view text);
rlpt::reinforce_pp_options reinforce_pp_from_spec(std::string_view text);
rlpt::reinforce_baseline_options reinforce_baseline_from_spec(std::string_view text);
rlpt::remax_options remax_from_spec(std::string_view text);

} // namespace rlpt_py
