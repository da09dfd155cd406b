// SPDX-License-Identifier: Apache-2.0
// GiGPO: against verl-agent's own functions (golden vectors), an fp64 definition written from the
// paper's equations (episode and step levels, both normalisations, interleaved rows, recurring
// states), a hand-computed case, the step returns against their loop, the anchor groups, and the
// errors.
#include "common.hpp"

#include "support/errors.hpp"
#include "support/random.hpp"

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace {

using rlpt::test::tolerance;

//! A batch of steps: episode groups (tasks), trajectories within them, anchor states per step.
struct steps {
  std::vector<std::int64_t> episode, traj, anchor;
  std::vector<float> score, reward;
};

//! `tasks` tasks, each with `n` trajectories of 1..max_len steps, rows interleaved across
//! trajectories (step t of every trajectory, then step t + 1), states drawn from a small set so
//! that they recur within and across trajectories and tasks.
steps make_steps(int tasks, int n, int max_len, std::uint64_t seed) {
  rlpt::test::rng r(seed);
  struct traj_t {
    std::int64_t task, id;
    int len;
    float score;
  };
  std::vector<traj_t> ts;
  for (int k = 0; k < tasks; ++k)
    for (int j = 0; j < n; ++j)
      ts.push_back({100 + 7 * k, static_cast<std::int64_t>(ts.size()) * 3 + 1, static_cast<int>(r.integer(1, max_len)),
                    r.bernoulli(0.5) ? 1.0f : 0.0f});
  steps s;
  for (int t = 0; t < max_len; ++t)
    for (const traj_t& tr : ts) {
      if (t >= tr.len) continue;
      s.episode.push_back(tr.task);
      s.traj.push_back(tr.id);
      s.anchor.push_back(t == 0 ? 0 : r.integer(0, 3)); // every trajectory of a task starts in state 0
      s.score.push_back(tr.score);
      s.reward.push_back(t + 1 == tr.len ? tr.score : static_cast<float>(r.uniform(-0.1, 0.1)));
    }
  return s;
}

//! Group mean and unbiased std of x over the rows with the same key (fp64).
template <class Key>
std::map<Key, std::pair<double, double>> moments(const std::vector<Key>& key, const std::vector<double>& x) {
  std::map<Key, std::vector<double>> by;
  for (std::size_t i = 0; i < x.size(); ++i) by[key[i]].push_back(x[i]);
  std::map<Key, std::pair<double, double>> out;
  for (const auto& [k, v] : by) {
    double m = 0.0;
    for (double y : v) m += y;
    m /= static_cast<double>(v.size());
    double ss = 0.0;
    for (double y : v) ss += (y - m) * (y - m);
    out[k] = {m, v.size() > 1 ? std::sqrt(ss / static_cast<double>(v.size() - 1)) : 0.0};
  }
  return out;
}

//! The paper's equations in fp64: returns per trajectory in row order, then both levels.
std::vector<double> reference(const steps& s, double gamma, bool use_std, double w, double eps) {
  const std::size_t n = s.score.size();
  std::vector<double> ret(n);
  std::map<std::int64_t, double> carry;
  for (std::size_t i = n; i-- > 0;) {
    const double g = static_cast<double>(s.reward[i]) + gamma * carry[s.traj[i]];
    ret[i] = g;
    carry[s.traj[i]] = g;
  }
  std::vector<double> score(s.score.begin(), s.score.end());
  std::vector<std::pair<std::int64_t, std::int64_t>> state(n);
  for (std::size_t i = 0; i < n; ++i) state[i] = {s.episode[i], s.anchor[i]};
  const auto me = moments(s.episode, score);
  const auto ms = moments(state, ret);
  std::map<std::int64_t, int> episode_size;
  std::map<std::pair<std::int64_t, std::int64_t>, int> state_size;
  for (std::size_t i = 0; i < n; ++i) ++episode_size[s.episode[i]], ++state_size[state[i]];
  std::vector<double> a(n);
  for (std::size_t i = 0; i < n; ++i) {
    double ae = score[i], as = 0.0;
    if (episode_size[s.episode[i]] > 1) {
      const auto [m, sd] = me.at(s.episode[i]);
      ae = use_std ? (score[i] - m) / (sd + eps) : score[i] - m;
    } else if (use_std) {
      ae = score[i] / (1.0 + eps);
    }
    if (state_size[state[i]] > 1) {
      const auto [m, sd] = ms.at(state[i]);
      as = use_std ? (ret[i] - m) / (sd + eps) : ret[i] - m;
    }
    a[i] = ae + w * as;
  }
  return a;
}

std::vector<double> run(const steps& s, double gamma, const rlpt::gigpo_options& o,
                        rlpt::gigpo_stats* stats = nullptr) {
  const auto episodes = rlpt::groups::from_ids(s.episode);
  const auto trajs = rlpt::groups::from_ids(s.traj);
  std::vector<float> ret(s.reward.size()), adv(s.reward.size());
  rlpt::step_returns(s.reward, trajs, gamma, ret);
  const auto anchors = rlpt::anchor_groups(episodes, s.anchor);
  const rlpt::gigpo_stats st = rlpt::gigpo_advantages(s.score, episodes, ret, anchors, adv, o);
  if (stats != nullptr) *stats = st;
  return {adv.begin(), adv.end()};
}

} // namespace

TEST_CASE("gigpo equals the fp64 definition: both normalisations, step weights, interleaved rows, recurring states") {
  // (tasks, trajectories per task, longest trajectory): the last two give episode groups of one
  // row (its score passes) and of two.
  const int shapes[][3] = {{5, 6, 7}, {6, 6, 2}, {4, 1, 1}, {3, 2, 3}};
  for (std::uint64_t seed : {1u, 2u, 3u, 4u}) {
    const auto& sh = shapes[seed - 1];
    const steps s = make_steps(sh[0], sh[1], sh[2], seed);
    for (rlpt::gigpo_norm norm : {rlpt::gigpo_norm::mean, rlpt::gigpo_norm::mean_std})
      for (double w : {1.0, 0.5, 0.0}) {
        CAPTURE(seed);
        CAPTURE(name(norm));
        CAPTURE(w);
        const rlpt::gigpo_options o{.norm = norm, .step_weight = w};
        const std::vector<double> want = reference(s, 0.95, norm == rlpt::gigpo_norm::mean_std, w, 1e-6);
        // fp32 inputs and output: a few roundings of values of order 1 (std division in mean_std).
        const std::vector<double> got = run(s, 0.95, o);
        RLPT_CHECK_CLOSE(got, want, 2e-6, 2e-6);
      }
  }
}

TEST_CASE("gigpo by hand: one task, three trajectories, a state they share and one seen once") {
  // Trajectory 0: states (0, 1), rewards (0, 1), score 1. Trajectory 1: states (0, 1), rewards
  // (0, 0), score 0. Trajectory 2: states (0, 2), rewards (0, 1), score 1. gamma = 0.5.
  steps s;
  s.episode = {9, 9, 9, 9, 9, 9};
  s.traj = {0, 1, 2, 0, 1, 2};
  s.anchor = {0, 0, 0, 1, 1, 2};
  s.score = {1, 0, 1, 1, 0, 1};
  s.reward = {0, 0, 0, 1, 0, 1};
  rlpt::gigpo_stats st;
  const std::vector<double> a = run(s, 0.5, {}, &st);
  // Returns: (0.5, 0, 0.5, 1, 0, 1). Episode mean over six rows 4/6; state 0's mean 1/3, state 1's
  // 1/2, state 2 alone.
  const double me = 4.0 / 6.0;
  const std::vector<double> want{1 - me + (0.5 - 1.0 / 3),
                                 0 - me + (0 - 1.0 / 3),
                                 1 - me + (0.5 - 1.0 / 3),
                                 1 - me + 0.5,
                                 0 - me - 0.5,
                                 1 - me + 0.0};
  RLPT_CHECK_CLOSE(a, want, 1e-6, 1e-7);
  CHECK(st.episode.size == std::vector<rlpt::index_t>{6});
  CHECK(st.step.size == std::vector<rlpt::index_t>{3, 2, 1});
  CHECK(st.step.num_degenerate == 1); // the state seen once
}

TEST_CASE("step_returns: the discounted recurrence along each trajectory, rows contiguous or interleaved") {
  const steps s = make_steps(4, 5, 9, 11);
  const auto trajs = rlpt::groups::from_ids(s.traj);
  CHECK(!trajs.contiguous());
  std::vector<float> got(s.reward.size());
  CHECK(rlpt::step_returns(s.reward, trajs, 0.9, got) == 0);
  std::map<std::int64_t, double> carry;
  std::vector<double> want(s.reward.size());
  for (std::size_t i = want.size(); i-- > 0;) want[i] = carry[s.traj[i]] = s.reward[i] + 0.9 * carry[s.traj[i]];
  const std::vector<double> got64(got.begin(), got.end());
  RLPT_CHECK_CLOSE(got64, want, 1e-6, 1e-7);

  // The same trajectories stored contiguously (sorted by trajectory, stable): the same returns.
  std::vector<std::size_t> order(s.traj.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return s.traj[a] < s.traj[b]; });
  std::vector<std::int64_t> ids;
  std::vector<float> r, g(order.size());
  for (std::size_t i : order) ids.push_back(s.traj[i]), r.push_back(s.reward[i]);
  const auto contiguous = rlpt::groups::from_ids(ids);
  CHECK(contiguous.contiguous());
  rlpt::step_returns(r, contiguous, 0.9, g);
  for (std::size_t j = 0; j < order.size(); ++j) CHECK(g[j] == got[order[j]]);
}

TEST_CASE("anchor_groups: the same state in two episode groups is two anchor groups, numbered by first appearance") {
  const std::vector<std::int64_t> episode{5, 5, 8, 5, 8, 8};
  const std::vector<std::int64_t> anchor{42, 7, 42, 42, 42, 7};
  const auto episodes = rlpt::groups::from_ids(episode);
  const auto a = rlpt::anchor_groups(episodes, anchor);
  CHECK(a.num_groups() == 4);
  const auto of = a.group_of();
  CHECK(std::vector<rlpt::index_t>(of.begin(), of.end()) == std::vector<rlpt::index_t>{0, 1, 2, 0, 2, 3});
}

TEST_CASE("gigpo errors: anchors across episode groups, options, lengths, non-finite rewards by row") {
  const std::vector<std::int64_t> episode{1, 1, 2, 2};
  const auto episodes = rlpt::groups::from_ids(episode);
  const std::vector<float> score{1, 0, 1, 1}, ret{0.5f, 0.25f, 1, 0};
  std::vector<float> out(4);
  const std::vector<std::int64_t> across{0, 1, 1, 2}; // rows 1 and 2 are in different episode groups
  RLPT_CHECK_ERROR(static_cast<void>(rlpt::gigpo_advantages(score, episodes, ret, rlpt::groups::from_ids(across), out)),
                   "rlpt.advantage.bad_groups",
                   "anchor group 1 holds rows 1 (episode group 0) and 2 (episode group 1)");
  const auto anchors = rlpt::anchor_groups(episodes, across);
  RLPT_CHECK_ERROR(static_cast<void>(rlpt::gigpo_advantages(score, episodes, ret, anchors, out, {.step_weight = NAN})),
                   "rlpt.advantage.bad_option", "step_weight = nan");
  RLPT_CHECK_ERROR(static_cast<void>(rlpt::gigpo_advantages(score, episodes, ret, anchors, out, {.epsilon = -1.0})),
                   "rlpt.advantage.bad_option", "epsilon = -1");
  std::vector<float> short_out(3);
  RLPT_CHECK_ERROR(static_cast<void>(rlpt::gigpo_advantages(score, episodes, ret, anchors, short_out)),
                   "rlpt.view.size_mismatch", "advantages has 3 elements, expected 4");
  const std::vector<float> bad{0.0f, NAN, 1.0f, 0.0f};
  std::vector<float> g(4);
  RLPT_CHECK_ERROR(rlpt::step_returns(bad, episodes, 0.9, g), "rlpt.advantage.nonfinite", "step_rewards");
  CHECK(rlpt::step_returns(bad, episodes, 0.9, g, rlpt::nonfinite::mask) == 1); // the trajectory is zeroed
  CHECK(g == std::vector<float>{0, 0, 1.0f, 0});
  RLPT_CHECK_ERROR(rlpt::step_returns(score, episodes, 1.5, g), "rlpt.advantage.bad_option", "gamma");
}

TEST_CASE("gigpo golden: verl-agent's compute_step_discounted_returns and compute_gigpo_outcome_advantage") {
  const rlpt::test::golden_file f = rlpt::test::advantage_golden("verl_agent_gigpo.bin");
  for (const std::string tag : {"a", "b"}) { // b: tasks of one trajectory (episode and anchor groups of one)
    CAPTURE(tag);
    const auto task = f.get<std::int64_t>(tag + "_task"), traj = f.get<std::int64_t>(tag + "_traj"),
               state = f.get<std::int64_t>(tag + "_state");
    const auto reward = f.get<float>(tag + "_reward"), score = f.get<float>(tag + "_score"),
               returns = f.get<float>(tag + "_returns");
    const auto episodes = rlpt::groups::from_ids(task);
    std::vector<float> ret(reward.size());
    rlpt::step_returns(reward, rlpt::groups::from_ids(traj), 0.95, ret);
    ADV_CHECK_CLOSE(std::vector<double>(ret.begin(), ret.end()), std::vector<double>(returns.begin(), returns.end()),
                    rlpt::test::vs_f32);
    const auto anchors = rlpt::anchor_groups(episodes, state);
    for (const std::string mode : {"mean_norm", "mean_std_norm"})
      for (const std::string w : {"1", "0.5"}) {
        CAPTURE(mode);
        CAPTURE(w);
        std::vector<float> adv(score.size());
        (void)rlpt::gigpo_advantages(score, episodes, returns, anchors, adv,
                                     rlpt::compat::verl_agent::gigpo(mode, std::stod(w)));
        ADV_CHECK_CLOSE(std::vector<double>(adv.begin(), adv.end()), f.get<double>(tag + "_" + mode + "_w" + w),
                        rlpt::test::vs_f32);
      }
  }
}
