// SPDX-License-Identifier: Apache-2.0
// rlpt_simulate_async: a deterministic discrete-event simulation of asynchronous RL training,
// driving rlpt's real admission (staleness_gate) and selection (pick_batch) code.
//
// Model
// - Generation: E inference engines with S decode slots each (continuous batching). A decode
//   step of an engine with n active sequences takes t_base + t_seq·n seconds and advances
//   each of them by one token (weights-bound decode: fewer sequences decode faster, but an
//   idle slot is wasted capacity). A group is G samples; it is ready when all are done.
// - Response lengths: lognormal (median 2000, sigma 0.8), longtail (15% hit the cap, 85%
//   lognormal median 1500, sigma 0.9) or uniform 256..8192, capped at 16384, plus a
//   256-token prompt (async_buffers.md §5.2).
// - Training: one step on B groups takes t_fixed + tokens / train_tps seconds (∝ tokens).
// - Weight sync: after every step the trainer publishes a version; every engine pauses for
//   sync_pause seconds. In-flight sequences keep their KV and continue under the new
//   weights (pause mode keep): their later tokens carry the new version.
// - sync: generate B groups, wait for all, train, sync (the classic loop, no gate).
// - async η: producers admit groups through staleness_gate (AReaL capacity formula,
//   max_concurrent = the slots) and the trainer takes batches with pick_batch (window η,
//   oldest first, stale policy wait or drop).
// Metrics: trained tokens per simulated second, trainer idle fraction (waiting for data or
// for the weight sync), generator idle fraction (idle slot-seconds over slot-seconds, sync
// pauses included), group staleness (trained version − dispatch version) and token staleness
// (trained version − version that generated the token), dropped groups.
#include <rlpt/staleness/gate.hpp>
#include <rlpt/staleness/metrics.hpp>
#include <rlpt/staleness/selection.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace {

using rlpt::index_t;
using rlpt::policy_version;

struct config {
  std::string dist = "all"; // longtail | lognormal | uniform | all
  index_t engines = 8;
  index_t slots = 32; // per engine
  index_t group = 8;  // samples per group (G)
  index_t batch = 32; // groups per step (B); B·G = 256 = every slot once
  index_t steps = 100;
  index_t prompt = 256;
  index_t cap = 16384;
  double t_base = 0.012;       // s per decode step, fixed part (weights read)
  double t_seq = 0.00025;      // s per decode step per active sequence (KV read)
  double train_fixed = 5.0;    // s per optimizer step
  double train_tps = 16000.0;  // trained tokens per second
  double sync_pause = 5.0;     // s every engine pauses per weight sync
  std::string policy = "both"; // wait | drop | both
  //! Gate concurrency cap in groups; 0 = engines·slots, i.e. only the slots limit what runs
  //! (a group with one straggler must not hold G slots' worth of admission).
  index_t max_concurrent = 0;
  std::uint64_t seed = 2026;
};

struct sequence {
  double remaining = 0.0;                                   // tokens still to generate
  index_t length = 0;                                       // response length
  std::size_t group = 0;                                    // index into groups
  std::vector<std::pair<policy_version, index_t>> segments; // (version, tokens) so far
  double generated = 0.0;
};

struct group_state {
  rlpt::ticket t;
  index_t pending = 0;                                            // samples not finished
  index_t tokens = 0;                                             // prompt + response tokens of all samples
  std::vector<std::pair<policy_version, index_t>> token_versions; // all samples' segments
  bool done = false;
};

struct engine {
  std::vector<std::size_t> active; // indices into seqs
};

struct result {
  std::string name;
  double time = 0.0;
  double trained_tokens = 0.0;
  double trainer_idle = 0.0;
  double slot_idle = 0.0; // slot-seconds
  rlpt::staleness_histogram group_age;
  rlpt::staleness_histogram token_age;
  index_t steps = 0;
  index_t dropped = 0;
  index_t generated_groups = 0;
};

class simulator {
public:
  simulator(const config& c, std::string dist, bool sync, index_t eta, rlpt::stale_policy pol)
      : c_(c), dist_(std::move(dist)), sync_(sync), eta_(eta), pol_(pol), rng_(c.seed),
        gate_({.max_staleness = eta,
               .batch_groups = c.batch,
               .max_concurrent = c.max_concurrent > 0 ? c.max_concurrent : c.engines * c.slots}) {
    engines_.resize(static_cast<std::size_t>(c.engines));
  }

  result run() {
    result r;
    r.name = sync_ ? "sync" : fmt::format("async eta={} {}", eta_, pol_ == rlpt::stale_policy::wait ? "wait" : "drop");
    double trainer_busy_until = 0.0; // training or waiting for its weight sync
    bool training = false;
    double train_end = 0.0;
    std::vector<std::size_t> batch;
    double pause_until = 0.0;
    index_t sync_dispatched_for = -1;
    while (r.steps < c_.steps) {
      // --- producers ----------------------------------------------------------------------
      if (sync_) {
        // Classic loop: all B groups of a step are dispatched together after the weight sync.
        if (!training && sync_dispatched_for < r.steps && now_ >= pause_until) {
          for (index_t g = 0; g < c_.batch; ++g) dispatch(rlpt::ticket{1, static_cast<policy_version>(r.steps), -1, 0});
          sync_dispatched_for = r.steps;
        }
      } else {
        while (free_slots() >= c_.group) {
          const rlpt::ticket t = gate_.try_admit();
          if (!t) break;
          dispatch(t);
        }
      }
      // --- trainer ------------------------------------------------------------------------
      if (!training && now_ >= trainer_busy_until) {
        batch.clear();
        if (sync_) {
          index_t done = 0;
          for (std::size_t i = 0; i < groups_.size(); ++i)
            if (groups_[i].done && !consumed_[i]) ++done;
          if (done == c_.batch)
            for (std::size_t i = 0; i < groups_.size(); ++i)
              if (groups_[i].done && !consumed_[i]) batch.push_back(i);
        } else {
          std::vector<rlpt::candidate> cands;
          std::vector<std::size_t> idx;
          for (const std::size_t i : ready_) {
            cands.push_back({groups_[i].t.version, groups_[i].t.target});
            idx.push_back(i);
          }
          const auto alive = gate_.alive();
          const rlpt::pick_result p = rlpt::pick_batch(
              cands, c_.batch, alive.version, {.max_staleness = eta_, .on_stale = pol_}, rlpt::in_flight(alive, cands));
          std::vector<std::uint8_t> gone(idx.size(), 0);
          for (const auto& [pos, act] : p.evict) {
            gate_.release(groups_[idx[static_cast<std::size_t>(pos)]].t, rlpt::release_reason::dropped);
            gone[static_cast<std::size_t>(pos)] = 1;
            ++r.dropped;
          }
          if (p.status == rlpt::pick_status::ready)
            for (const index_t pos : p.take) {
              batch.push_back(idx[static_cast<std::size_t>(pos)]);
              gate_.consume(groups_[idx[static_cast<std::size_t>(pos)]].t);
              gone[static_cast<std::size_t>(pos)] = 1;
            }
          std::vector<std::size_t> rest;
          for (std::size_t k = 0; k < idx.size(); ++k)
            if (!gone[k]) rest.push_back(idx[k]);
          ready_ = std::move(rest);
        }
        if (!batch.empty()) {
          const auto v = static_cast<policy_version>(gate_version());
          index_t tokens = 0;
          for (const std::size_t i : batch) {
            consumed_[i] = 1;
            tokens += groups_[i].tokens;
            r.group_age.add(v - groups_[i].t.version);
            for (const auto& [tv, n] : groups_[i].token_versions) r.token_age.add(v - tv, n);
          }
          r.trained_tokens += static_cast<double>(tokens);
          training = true;
          train_end = now_ + c_.train_fixed + static_cast<double>(tokens) / c_.train_tps;
        }
      }
      // --- next event ---------------------------------------------------------------------
      double next = std::numeric_limits<double>::infinity();
      if (training) next = train_end;
      if (now_ < pause_until) next = std::min(next, pause_until);
      if (!training && now_ < trainer_busy_until) next = std::min(next, trainer_busy_until);
      const double gen_dt = now_ >= pause_until ? next_completion() : std::numeric_limits<double>::infinity();
      next = std::min(next, now_ + gen_dt);
      if (!std::isfinite(next)) {
        fmt::print(stderr, "simulation stalled at t = {:.1f} s, step {}\n", now_, r.steps);
        std::exit(2);
      }
      // Accounting over [now, next).
      const double dt = next - now_;
      const bool paused = now_ < pause_until;
      index_t busy = 0;
      for (const auto& e : engines_) busy += static_cast<index_t>(e.active.size());
      r.slot_idle += dt * static_cast<double>(c_.engines * c_.slots - (paused ? 0 : busy));
      if (!training) r.trainer_idle += dt;
      if (!paused) advance(dt);
      now_ = next;
      finish_sequences();
      if (training && now_ >= train_end) {
        training = false;
        ++r.steps;
        // Weight sync: the trainer and every engine wait sync_pause seconds.
        publish();
        pause_until = now_ + c_.sync_pause;
        trainer_busy_until = pause_until;
      }
    }
    r.time = now_;
    r.generated_groups = static_cast<index_t>(groups_.size());
    return r;
  }

private:
  [[nodiscard]] index_t free_slots() const {
    index_t busy = 0;
    for (const auto& e : engines_) busy += static_cast<index_t>(e.active.size());
    return c_.engines * c_.slots - busy;
  }
  [[nodiscard]] index_t gate_version() const { return sync_ ? sync_version_ : gate_.version(); }

  void publish() {
    if (sync_)
      ++sync_version_;
    else
      gate_.publish();
    const auto v = static_cast<policy_version>(gate_version());
    for (auto& e : engines_)
      for (const std::size_t s : e.active) seqs_[s].segments.emplace_back(v, 0);
  }

  index_t draw_length() {
    std::normal_distribution<double> z(0.0, 1.0);
    double len = 0.0;
    if (dist_ == "lognormal") {
      len = 2000.0 * std::exp(0.8 * z(rng_));
    } else if (dist_ == "longtail") {
      len = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < 0.15 ? static_cast<double>(c_.cap)
                                                                          : 1500.0 * std::exp(0.9 * z(rng_));
    } else {
      len = std::uniform_real_distribution<double>(256.0, 8192.0)(rng_);
    }
    return std::clamp<index_t>(static_cast<index_t>(std::lround(len)), 1, c_.cap);
  }

  void dispatch(const rlpt::ticket& t) {
    group_state g;
    g.t = t;
    g.pending = c_.group;
    const std::size_t gi = groups_.size();
    for (index_t s = 0; s < c_.group; ++s) {
      sequence q;
      q.length = draw_length();
      q.remaining = static_cast<double>(q.length);
      q.group = gi;
      q.segments.emplace_back(t.version, 0);
      g.tokens += c_.prompt + q.length;
      // Least-loaded engine with a free slot.
      auto it = std::min_element(engines_.begin(), engines_.end(),
                                 [](const engine& a, const engine& b) { return a.active.size() < b.active.size(); });
      it->active.push_back(seqs_.size());
      seqs_.push_back(std::move(q));
    }
    groups_.push_back(std::move(g));
    consumed_.push_back(0);
  }

  [[nodiscard]] double step_time(std::size_t active) const {
    return c_.t_base + c_.t_seq * static_cast<double>(active);
  }

  [[nodiscard]] double next_completion() const {
    double best = std::numeric_limits<double>::infinity();
    for (const auto& e : engines_) {
      if (e.active.empty()) continue;
      double rem = std::numeric_limits<double>::infinity();
      for (const std::size_t s : e.active) rem = std::min(rem, seqs_[s].remaining);
      best = std::min(best, rem * step_time(e.active.size()));
    }
    return best;
  }

  void advance(double dt) {
    for (auto& e : engines_) {
      if (e.active.empty()) continue;
      const double tokens = dt / step_time(e.active.size());
      for (const std::size_t s : e.active) {
        sequence& q = seqs_[s];
        const double n = std::min(tokens, q.remaining);
        q.remaining -= n;
        q.generated += n;
        // Whole tokens per version segment (fractions settle at the next boundary).
        q.segments.back().second = static_cast<index_t>(std::lround(q.generated)) - segment_base(q);
      }
    }
  }

  static index_t segment_base(const sequence& q) {
    index_t base = 0;
    for (std::size_t k = 0; k + 1 < q.segments.size(); ++k) base += q.segments[k].second;
    return base;
  }

  void finish_sequences() {
    for (auto& e : engines_) {
      std::vector<std::size_t> keep;
      for (const std::size_t s : e.active) {
        sequence& q = seqs_[s];
        if (q.remaining > 1e-9) {
          keep.push_back(s);
          continue;
        }
        q.segments.back().second = q.length - segment_base(q);
        group_state& g = groups_[q.group];
        for (const auto& seg : q.segments)
          if (seg.second > 0) g.token_versions.push_back(seg);
        if (--g.pending == 0) {
          g.done = true;
          if (!sync_) {
            gate_.accept(g.t);
            ready_.push_back(q.group);
          }
        }
        q.segments.clear();
        q.segments.shrink_to_fit();
      }
      e.active = std::move(keep);
    }
  }

  config c_;
  std::string dist_;
  bool sync_;
  index_t eta_;
  rlpt::stale_policy pol_;
  std::mt19937_64 rng_;
  rlpt::staleness_gate gate_;
  std::vector<engine> engines_;
  std::vector<sequence> seqs_;
  std::vector<group_state> groups_;
  std::vector<std::uint8_t> consumed_;
  std::vector<std::size_t> ready_;
  double now_ = 0.0;
  index_t sync_version_ = 0;
};

bool parse(config& c, int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto eq = a.find('=');
    if (a.substr(0, 2) != "--" || eq == std::string_view::npos) return false;
    const std::string key(a.substr(2, eq - 2));
    const std::string val(a.substr(eq + 1));
    auto num = [&] { return std::strtod(val.c_str(), nullptr); };
    auto integer = [&] { return static_cast<index_t>(std::strtoll(val.c_str(), nullptr, 10)); };
    if (key == "dist")
      c.dist = val;
    else if (key == "engines")
      c.engines = integer();
    else if (key == "slots")
      c.slots = integer();
    else if (key == "group")
      c.group = integer();
    else if (key == "batch")
      c.batch = integer();
    else if (key == "steps")
      c.steps = integer();
    else if (key == "train-tps")
      c.train_tps = num();
    else if (key == "train-fixed")
      c.train_fixed = num();
    else if (key == "sync-pause")
      c.sync_pause = num();
    else if (key == "t-base")
      c.t_base = num();
    else if (key == "t-seq")
      c.t_seq = num();
    else if (key == "policy")
      c.policy = val;
    else if (key == "max-concurrent")
      c.max_concurrent = integer();
    else if (key == "seed")
      c.seed = static_cast<std::uint64_t>(std::strtoull(val.c_str(), nullptr, 10));
    else
      return false;
  }
  return c.max_concurrent >= 0 && c.engines >= 1 && c.slots >= 1 && c.group >= 1 && c.batch >= 1 && c.steps >= 1 &&
         c.engines * c.slots >= c.group && (c.engines * c.slots / c.group) >= 1;
}

} // namespace

int main(int argc, char** argv) {
  config c;
  if (!parse(c, argc, argv)) {
    fmt::print(stderr, "usage: rlpt_simulate_async [--dist=longtail|lognormal|uniform|all] [--steps=N] [--engines=E] "
                       "[--slots=S] [--group=G] [--batch=B] [--train-tps=X] [--train-fixed=S] [--sync-pause=S] "
                       "[--t-base=S] [--t-seq=S] [--policy=wait|drop|both] [--max-concurrent=N] [--seed=N]\n");
    return 1;
  }
  fmt::print("rlpt_simulate_async: {} engines x {} slots, G = {}, B = {} groups, {} steps; decode step {:.1f} ms + "
             "{:.2f} ms/seq; train {:.0f} s + tokens / {:.0f} tok/s; weight sync pause {:.0f} s; seed {}\n",
             c.engines, c.slots, c.group, c.batch, c.steps, 1e3 * c.t_base, 1e3 * c.t_seq, c.train_fixed, c.train_tps,
             c.sync_pause, c.seed);
  std::vector<std::string> dists;
  if (c.dist == "all")
    dists = {"longtail", "lognormal", "uniform"};
  else
    dists = {c.dist};
  std::vector<rlpt::stale_policy> pols;
  if (c.policy != "drop") pols.push_back(rlpt::stale_policy::wait);
  if (c.policy != "wait") pols.push_back(rlpt::stale_policy::drop);
  for (const auto& d : dists) {
    fmt::print("\n== {} response lengths ==\n", d);
    fmt::print("{:<20} {:>11} {:>8} {:>12} {:>10} {:>8} {:>9}  {:<34} {}\n", "mode", "tok/s", "speedup", "trainer idle",
               "gen idle", "dropped", "s/step", "group staleness", "token staleness");
    const result base = simulator(c, d, true, 0, rlpt::stale_policy::wait).run();
    auto row = [&](const result& r) {
      const double tps = r.trained_tokens / r.time;
      const double slot_s = r.time * static_cast<double>(c.engines * c.slots);
      fmt::print("{:<20} {:>11.0f} {:>7.2f}x {:>11.1f}% {:>9.1f}% {:>7.1f}% {:>9.1f}  {:<34} {}\n", r.name, tps,
                 tps / (base.trained_tokens / base.time), 100.0 * r.trainer_idle / r.time, 100.0 * r.slot_idle / slot_s,
                 100.0 * static_cast<double>(r.dropped) / static_cast<double>(std::max<index_t>(1, r.generated_groups)),
                 r.time / static_cast<double>(r.steps), r.group_age.to_string(), r.token_age.to_string());
    };
    row(base);
    for (const auto pol : pols)
      for (const index_t eta : {0, 1, 2, 4}) row(simulator(c, d, false, eta, pol).run());
  }
  return 0;
}
