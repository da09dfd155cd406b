// SPDX-License-Identifier: Apache-2.0
// A small seeded discrete-event harness for invariant tests: producers admit groups through a
// real staleness_gate, generate for a heavy-tailed random time (weight publishes during a
// generation give later tokens newer versions, as with in-flight updates), and finish or fail;
// a trainer picks batches with the real pick_batch, consumes them and publishes. Every ticket's
// fate is recorded so the tests can check that nothing is lost or consumed twice.
#pragma once

#include <rlpt/staleness/gate.hpp>
#include <rlpt/staleness/metrics.hpp>
#include <rlpt/staleness/selection.hpp>

#include "support/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace rlpt::test {

struct harness_config {
  index_t eta = 1;
  index_t batch = 4;   // B
  index_t workers = 8; // concurrent generations the engine can run (gate cap = max(B, this))
  admission_mode mode = admission_mode::capacity;
  selection_options select{};
  double reject_prob = 0.1; // a generation fails / a filter rejects it
  index_t steps = 60;       // trainer steps to run
  std::uint64_t seed = 1;
  index_t trainer_batch = 0;       // groups the trainer wants per step (0: batch)
  index_t stall_after_step = -1;   // producers stop admitting after this step (-1: never)
  index_t hang_after_step = -1;    // generations started after this step never finish (-1: never)
  index_t restore_at_step = -1;    // crash + restore after this step (-1: never)
  double starvation_after = 500.0; // simulated seconds
  double horizon = 1e7;            // give up (simulated seconds)
};

enum class fate : std::uint8_t { alive, consumed, rejected, dropped, requeued, lost_in_crash };

struct consumed_group {
  std::uint64_t id;          // harness-wide id (stable across a restore)
  policy_version head;       // dispatch version
  policy_version tail;       // version of its last token
  policy_version trained_at; // version of the step that consumed it
};

struct harness_result {
  std::vector<consumed_group> consumed;
  std::unordered_map<std::uint64_t, fate> fates;
  std::vector<starvation_report> starvations;
  index_t steps_done = 0;
  index_t dropped = 0;
  index_t requeued = 0;
  index_t max_running = 0;
  index_t burst_after_restore = -1; // capacity right after the restore
  index_t survivors_at_restore = 0;
  double end_time = 0.0;
  gate_counts final_counts;
};

class harness {
public:
  explicit harness(harness_config c) : cfg_(c), rng_(c.seed) { make_gate(); }

  harness_result run() {
    harness_result r;
    double now = 0.0;
    double trainer_free_at = 0.0;
    bool training = false;
    std::vector<consumed_group> pending_batch;
    starvation_monitor monitor({.after_s = cfg_.starvation_after});
    pick_result last_pick;
    while (r.steps_done < cfg_.steps && now < cfg_.horizon) {
      // Producers: fill every free worker the gate allows.
      const bool stalled = cfg_.stall_after_step >= 0 && r.steps_done > cfg_.stall_after_step;
      while (!stalled && static_cast<index_t>(flight_.size()) < cfg_.workers) {
        const ticket t = gate_->try_admit();
        if (!t) break;
        const std::uint64_t id = ++next_id_;
        const bool hang = cfg_.hang_after_step >= 0 && r.steps_done > cfg_.hang_after_step;
        flight_.push_back({t, id, now, hang ? 2.0 * cfg_.horizon : now + duration(), t.version, t.version});
        r.fates[id] = fate::alive;
      }
      r.max_running = std::max(r.max_running, gate_->counts().running);

      // Trainer: try to form a batch whenever idle.
      if (!training) {
        std::vector<candidate> cands;
        for (const auto& g : ready_) cands.push_back({g.t.version, g.t.target});
        const staleness_gate::alive_tickets alive = gate_->alive();
        const std::vector<version_count> pending = in_flight(alive, cands);
        const policy_version v = alive.version;
        const pick_result p = pick_batch(cands, want(), v, cfg_.select, pending, false);
        last_pick = p;
        last_pick.evict.clear();
        std::vector<std::uint8_t> gone(ready_.size(), 0);
        for (const auto& [pos, act] : p.evict) {
          auto& g = ready_[static_cast<std::size_t>(pos)];
          const bool rq = act == stale_action::requeue;
          gate_->release(g.t, rq ? release_reason::requeued : release_reason::dropped);
          r.fates[g.id] = rq ? fate::requeued : fate::dropped;
          (rq ? r.requeued : r.dropped) += 1;
          gone[static_cast<std::size_t>(pos)] = 1;
        }
        if (p.status == pick_status::ready) {
          pending_batch.clear();
          for (const index_t pos : p.take) {
            auto& g = ready_[static_cast<std::size_t>(pos)];
            gate_->consume(g.t);
            CHECK_MESSAGE(r.fates[g.id] == fate::alive, "group ", g.id, " consumed twice or after it left");
            r.fates[g.id] = fate::consumed;
            pending_batch.push_back({g.id, g.head, g.tail, v});
            gone[static_cast<std::size_t>(pos)] = 1;
          }
          training = true;
          trainer_free_at = now + train_time();
          monitor.served();
        } else if (auto rep = monitor.observe(now, p, want(), v, gate_->capacity(), pending,
                                              cfg_.select.order == pick_order::target_version)) {
          r.starvations.push_back(*rep);
        }
        std::vector<item> rest;
        for (std::size_t i = 0; i < ready_.size(); ++i)
          if (!gone[i]) rest.push_back(ready_[i]);
        ready_ = std::move(rest);
      }

      // Next event: a generation finishing or the trainer finishing its step.
      double next = cfg_.horizon;
      std::size_t who = flight_.size();
      for (std::size_t i = 0; i < flight_.size(); ++i)
        if (flight_[i].done < next) {
          next = flight_[i].done;
          who = i;
        }
      const bool trainer_next = training && trainer_free_at <= next;
      if (trainer_next) next = trainer_free_at;
      if (!training && (who == flight_.size() || next >= cfg_.horizon)) {
        // Nothing will ever happen again (stalled producers): let starvation be observed once more.
        if (auto rep =
                monitor.observe(now + cfg_.starvation_after, last_pick, want(), gate_->version(), gate_->capacity(),
                                gate_->running(), cfg_.select.order == pick_order::target_version))
          r.starvations.push_back(*rep);
        break;
      }
      now = next;
      if (trainer_next) {
        training = false;
        r.consumed.insert(r.consumed.end(), pending_batch.begin(), pending_batch.end());
        gate_->publish(); // in-flight generations continue; their next tokens carry the new version
        for (auto& f : flight_) f.tail = gate_->version();
        ++r.steps_done;
        if (r.steps_done == cfg_.restore_at_step) restore(r);
        continue;
      }
      item f = flight_[who];
      flight_.erase(flight_.begin() + static_cast<std::ptrdiff_t>(who));
      if (rng_.bernoulli(cfg_.reject_prob)) {
        gate_->reject(f.t);
        r.fates[f.id] = fate::rejected;
      } else {
        gate_->accept(f.t);
        ready_.push_back(f);
      }
    }
    r.end_time = now;
    r.final_counts = gate_->counts();
    return r;
  }

  [[nodiscard]] staleness_gate& gate() { return *gate_; }
  [[nodiscard]] index_t ready_count() const { return static_cast<index_t>(ready_.size()); }
  [[nodiscard]] index_t flight_count() const { return static_cast<index_t>(flight_.size()); }

private:
  struct item {
    ticket t;
    std::uint64_t id;
    double start;
    double done;
    policy_version head;
    policy_version tail = -1;
  };

  [[nodiscard]] index_t want() const { return cfg_.trainer_batch > 0 ? cfg_.trainer_batch : cfg_.batch; }

  void make_gate() {
    gate_options o{.max_staleness = cfg_.eta,
                   .batch_groups = cfg_.batch,
                   .max_concurrent = std::max(cfg_.batch, cfg_.workers),
                   .mode = cfg_.mode,
                   .clock = nullptr,
                   .metrics = &metrics_};
    gate_ = std::make_unique<staleness_gate>(o);
  }

  // Heavy tail: lognormal body, 10% of generations 8x longer.
  double duration() {
    const double base = std::exp(rng_.normal(0.0, 0.8)) * 10.0;
    return rng_.bernoulli(0.1) ? base * 8.0 : base;
  }
  double train_time() { return 5.0 + rng_.uniform(0.0, 10.0); }

  // Crash: in-flight work is lost; the ready groups survive (a restored buffer); a new gate
  // recovers at the current version.
  void restore(harness_result& r) {
    const policy_version v = gate_->version();
    for (const auto& f : flight_) r.fates[f.id] = fate::lost_in_crash;
    flight_.clear();
    std::vector<recovered_group> survivors;
    for (const auto& g : ready_) survivors.push_back({g.t.version, g.t.target});
    make_gate();
    const std::vector<ticket> fresh = gate_->recover(v, survivors);
    for (std::size_t i = 0; i < ready_.size(); ++i) ready_[i].t = fresh[i];
    r.survivors_at_restore = static_cast<index_t>(survivors.size());
    r.burst_after_restore = gate_->capacity();
  }

  harness_config cfg_;
  rng rng_;
  staleness_metrics metrics_;
  std::unique_ptr<staleness_gate> gate_;
  std::vector<item> flight_;
  std::vector<item> ready_;
  std::uint64_t next_id_ = 0;
};

} // namespace rlpt::test
