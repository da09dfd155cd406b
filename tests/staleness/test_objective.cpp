// SPDX-License-Identifier: Apache-2.0
// Staleness feeding the objective (rlpt::evaluate): stale tokens masked out leave the loss and
// its denominator exactly as if they had never been in the batch (whatever garbage they hold),
// and the approximated proximal log-probs go in as old_logp of decoupled PPO.
#include <rlpt/objective/evaluate.hpp>
#include <rlpt/staleness/proximal.hpp>
#include <rlpt/staleness/token_mask.hpp>

#include "support/random.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <vector>

using namespace rlpt;

TEST_CASE("masked stale tokens leave the objective's loss and denominator, proximal logprobs feed old_logp") {
  rlpt::test::rng rng(61);
  for (int trial = 0; trial < 40; ++trial) {
    const policy_version current = static_cast<policy_version>(rng.integer(3, 9));
    const index_t seqs = rng.integer(2, 6);
    std::vector<index_t> offsets{0};
    for (index_t s = 0; s < seqs; ++s) offsets.push_back(offsets.back() + rng.integer(4, 40));
    const token_layout layout = token_layout::packed(offsets);
    const auto n = static_cast<std::size_t>(offsets.back());
    std::vector<policy_version> ver(n);
    std::vector<mask_t> mask(n);
    std::vector<float> logp(n), behav(n), seq_adv(static_cast<std::size_t>(seqs));
    for (index_t s = 0; s < seqs; ++s) {
      seq_adv[static_cast<std::size_t>(s)] = static_cast<float>(rng.normal());
      auto v = static_cast<policy_version>(rng.integer(current - 3, current));
      for (index_t i = offsets[static_cast<std::size_t>(s)]; i < offsets[static_cast<std::size_t>(s) + 1]; ++i) {
        const auto k = static_cast<std::size_t>(i);
        const bool prompt = i - offsets[static_cast<std::size_t>(s)] < 2;
        if (!prompt && v < current && rng.bernoulli(0.2)) ++v;
        ver[k] = prompt ? -1 : v;
        mask[k] = prompt ? 0 : 1;
        behav[k] = static_cast<float>(rng.uniform(-4.0, -0.1));
        logp[k] = behav[k] + static_cast<float>(rng.normal(0.0, 0.1));
      }
    }
    std::vector<float> prox(n);
    proximal_logprobs(behav, logp, ver, mask, current, prox);
    std::vector<mask_t> fresh(n);
    const token_mask_result tm = mask_stale_tokens(layout, ver, mask, current, fresh, {.max_age = 1});

    objective obj;
    obj.policy = ppo_clip{};
    objective_inputs in;
    in.layout = layout;
    in.mask = fresh;
    in.logp = logp;
    in.old_logp = prox;
    in.behav_logp = behav;
    in.seq_adv = seq_adv;
    const objective_result full = evaluate(obj, in);
    CHECK(full.loss_tokens == static_cast<double>(tm.kept));

    // The same batch with the stale tokens replaced by garbage: nothing changes.
    std::vector<float> logp_g = logp, prox_g = prox, behav_g = behav;
    for (std::size_t k = 0; k < n; ++k)
      if (fresh[k] == 0) {
        logp_g[k] = std::numeric_limits<float>::quiet_NaN();
        prox_g[k] = std::numeric_limits<float>::infinity();
        behav_g[k] = -1e30f;
      }
    in.logp = logp_g;
    in.old_logp = prox_g;
    in.behav_logp = behav_g;
    const objective_result garbage = evaluate(obj, in);
    CHECK(garbage.loss == full.loss);

    // The batch with only the kept tokens (each sequence compacted): the same token-mean loss.
    std::vector<index_t> c_off{0};
    std::vector<float> c_logp, c_prox, c_behav, c_adv;
    std::vector<mask_t> c_mask;
    for (index_t s = 0; s < seqs; ++s) {
      index_t kept = 0;
      for (index_t i = offsets[static_cast<std::size_t>(s)]; i < offsets[static_cast<std::size_t>(s) + 1]; ++i) {
        const auto k = static_cast<std::size_t>(i);
        if (fresh[k] == 0) continue;
        c_logp.push_back(logp[k]);
        c_prox.push_back(prox[k]);
        c_behav.push_back(behav[k]);
        c_mask.push_back(1);
        ++kept;
      }
      if (kept == 0) continue; // a fully stale sequence contributes no loss term
      c_off.push_back(c_off.back() + kept);
      c_adv.push_back(seq_adv[static_cast<std::size_t>(s)]);
    }
    if (c_off.size() == 1) continue;
    objective_inputs cin;
    const token_layout clayout = token_layout::packed(c_off);
    cin.layout = clayout;
    cin.mask = c_mask;
    cin.logp = c_logp;
    cin.old_logp = c_prox;
    cin.behav_logp = c_behav;
    cin.seq_adv = c_adv;
    const objective_result compact = evaluate(obj, cin);
    CHECK(compact.loss_tokens == full.loss_tokens);
    CHECK(compact.loss == doctest::Approx(full.loss).epsilon(1e-6));
  }
}
