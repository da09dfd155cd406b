// SPDX-License-Identifier: Apache-2.0
// rlpt's side of the rollout comparisons of scripts/bench-peers (bench/peers/blocks/rollout.py):
// times single calls with the protocol of bench/support/peer_timing.hpp (one thread, cold calls,
// the result allocated by every call, process CPU time per call) and prints one JSON line.
//
//   bench_rollout_peer balance    LENGTHS_FILE K EQUAL(0|1) ALGO(verl|kk|lpt|best) [timing]
//   bench_rollout_peer microbatch LENGTHS_FILE BUDGET ALGO(verl|kk|ffd) [timing]
//   bench_rollout_peer pack       LENGTHS_FILE BUDGET PAD_TO [timing]
//   bench_rollout_peer buffer     PRODUCERS CONSUMERS RECORDS GROUP_SIZE MEAN_LEN [timing]
//   [timing] = --warmup N --calls N --flush BYTES --out DIR
//
// LENGTHS_FILE holds one sequence length per line. With --out, balance and microbatch write the
// parts (one line of item indices per part, ascending) to DIR/parts.txt.
#include <rlpt/rollout.hpp>

#include "support/bandwidth.hpp"
#include "support/peer_timing.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <ctime>
#include <time.h>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

using clock_type = std::chrono::steady_clock;

std::vector<rlpt::index_t> read_lengths(const char* path) {
  std::ifstream in(path);
  std::vector<rlpt::index_t> out;
  for (rlpt::index_t x; in >> x;) out.push_back(x);
  if (out.empty()) {
    fmt::print(stderr, "no lengths in {}\n", path);
    std::exit(2);
  }
  return out;
}

double cpu_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

using rlpt::bench::timing_plan;

//! Writes one line of item indices per part (ascending) to DIR/parts.txt.
template <class Parts> void write_parts(const std::string& dir, rlpt::index_t count, Parts&& part) {
  std::FILE* f = std::fopen((dir + "/parts.txt").c_str(), "w");
  if (f == nullptr) throw std::runtime_error("cannot write " + dir + "/parts.txt");
  for (rlpt::index_t p = 0; p < count; ++p) {
    std::vector<rlpt::index_t> items(part(p).begin(), part(p).end());
    std::sort(items.begin(), items.end());
    for (std::size_t i = 0; i < items.size(); ++i)
      std::fprintf(f, i ? " %lld" : "%lld", static_cast<long long>(items[i]));
    std::fputc('\n', f);
  }
  std::fclose(f);
}

int balance(const char* file, rlpt::index_t k, bool equal, const std::string& algo, const timing_plan& plan) {
  const auto len = read_lengths(file);
  rlpt::balance_options o = rlpt::compat::verl::balance(k);
  o.equal_count = equal;
  if (algo == "kk") o.refine = true;
  if (algo == "lpt") {
    o.algorithm = rlpt::partition_algorithm::lpt;
    o.refine = false;
  }
  if (algo == "best") {
    o.algorithm = rlpt::partition_algorithm::best;
    o.refine = true;
  }
  // One call per step in a trainer: each call is timed alone, cold (plan.flush), and returns the
  // partition it allocated, as verl's get_seqlen_balanced_partitions returns its lists.
  const auto t = rlpt::bench::time_calls(plan, [&] { return rlpt::balance(len, o); });
  const rlpt::partition p = rlpt::balance(len, o);
  if (!plan.out.empty()) write_parts(plan.out, p.num_parts(), [&](rlpt::index_t i) { return p.part(i); });
  fmt::print("{{\"op\": \"balance\", \"algo\": \"{}\", \"max_load\": {:.17g}, \"min_load\": {:.17g}, "
             "\"mean_load\": {:.17g}, \"imbalance\": {:.17g}, {}}}\n",
             algo, p.max_load(), p.min_load(), p.mean_load(), p.imbalance(), rlpt::bench::json_series(t));
  return 0;
}

rlpt::microbatch_options mb_options(rlpt::index_t budget, const std::string& algo) {
  rlpt::microbatch_options o = rlpt::compat::verl::microbatches(budget);
  if (algo == "kk") o.kk_attempts = 8; // rlpt default: FFD after 8 overshooting tries
  if (algo == "ffd") o = rlpt::compat::areal::microbatches(budget);
  return o;
}

int microbatch(const char* file, rlpt::index_t budget, const std::string& algo, const timing_plan& plan) {
  const auto len = read_lengths(file);
  const rlpt::microbatch_options o = mb_options(budget, algo);
  const auto s = rlpt::bench::time_calls(plan, [&] { return rlpt::plan_microbatches(len, o); });
  const rlpt::microbatch_plan p = rlpt::plan_microbatches(len, o);
  if (!plan.out.empty()) write_parts(plan.out, p.num_microbatches(), [&](rlpt::index_t m) { return p.microbatch(m); });
  // Waste if each micro-batch were a padded [rows, longest] tensor, and packed with 256 alignment.
  rlpt::index_t padded = 0, aligned = 0, tokens = 0;
  for (rlpt::index_t m = 0; m < p.num_microbatches(); ++m) {
    rlpt::index_t longest = 0, t = 0;
    for (const auto i : p.microbatch(m)) {
      longest = std::max(longest, len[static_cast<std::size_t>(i)]);
      t += len[static_cast<std::size_t>(i)];
    }
    padded += longest * p.microbatch(m).size();
    aligned += (t + 255) / 256 * 256;
    tokens += t;
  }
  const double mean = static_cast<double>(tokens) / static_cast<double>(p.num_microbatches());
  fmt::print("{{\"op\": \"microbatch\", {}, \"count\": {}, \"max_tokens\": {}, \"tokens\": {}, "
             "\"mb_imbalance\": {:.9g}, \"fill\": {:.9g}, \"pad_to_max_waste\": {:.9g}, \"align256_waste\": {:.9g}, "
             "\"fell_back\": {}}}\n",
             rlpt::bench::json_series(s), p.num_microbatches(), p.max_tokens(), tokens,
             static_cast<double>(p.max_tokens()) / mean,
             static_cast<double>(tokens) / static_cast<double>(p.num_microbatches() * budget),
             static_cast<double>(padded - tokens) / static_cast<double>(tokens),
             static_cast<double>(aligned - tokens) / static_cast<double>(tokens), p.fell_back ? "true" : "false");
  return 0;
}

// Plan + pack every micro-batch into varlen buffers: the end-to-end work rearrange_micro_batches does.
// Padding is counted from what pack wrote (PAD_TO 1: verl remove_padding; 256: AReaL).
int pack(const char* file, rlpt::index_t budget, rlpt::index_t pad_to, const timing_plan& plan) {
  const auto len = read_lengths(file);
  std::vector<rlpt::trajectory> recs;
  std::mt19937 g(1);
  for (std::size_t i = 0; i < len.size(); ++i) {
    rlpt::trajectory t;
    t.group_id = static_cast<std::int64_t>(i);
    const auto n = static_cast<std::size_t>(len[i]);
    t.prompt_len = 1;
    t.tokens.resize(n);
    for (auto& x : t.tokens) x = static_cast<rlpt::token_id>(g() % 50000);
    t.loss_mask.assign(n, 1);
    t.loss_mask[0] = 0;
    t.logprobs.assign(n, -1.0f);
    t.versions.assign(n, 0);
    t.versions[0] = -1;
    t.rewards = {0.0f};
    recs.push_back(std::move(t));
  }
  const rlpt::rollout_batch batch = rlpt::rollout_batch::gather(recs, {});
  const rlpt::microbatch_options o = rlpt::compat::verl::microbatches(budget);
  const rlpt::pack_options po{.pad_to_multiple = pad_to};
  auto call = [&] { // the micro-batches are the call's result (verl returns its TensorDicts)
    std::vector<rlpt::packed_microbatch> mbs;
    const auto lengths = batch.lengths();
    const rlpt::microbatch_plan p = rlpt::plan_microbatches(lengths, o);
    for (rlpt::index_t m = 0; m < p.num_microbatches(); ++m) mbs.push_back(rlpt::pack(batch, p.microbatch(m), po));
    return mbs;
  };
  const auto s = rlpt::bench::time_calls(plan, call);
  const std::vector<rlpt::packed_microbatch> out = call();
  rlpt::index_t real = 0, pad = 0, flat = 0;
  for (const auto& m : out) {
    real += m.info.tokens;
    pad += m.info.pad_tokens;
    flat += static_cast<rlpt::index_t>(m.tokens.size());
  }
  if (real != batch.num_tokens() || flat != real + pad) {
    fmt::print(stderr, "pack accounting broken: {} real + {} pad tokens, {} packed, {} in the batch\n", real, pad, flat,
               batch.num_tokens());
    return 1;
  }
  fmt::print("{{\"op\": \"pack\", {}, \"count\": {}, \"tokens\": {}, \"pad_tokens\": {}, "
             "\"packed_tokens\": {}, \"pad_waste\": {:.9g}}}\n",
             rlpt::bench::json_series(s), out.size(), batch.num_tokens(), pad, flat,
             static_cast<double>(pad) / static_cast<double>(real));
  return 0;
}

int buffer(int producers, int consumers, rlpt::index_t records, rlpt::index_t group_size, rlpt::index_t mean_len) {
  const rlpt::index_t groups = records / group_size;
  // Records are built before timing so the figure is the buffer's own overhead (push, group
  // assembly, pop, gathering into columns), not the producers' allocation of records.
  std::vector<std::vector<rlpt::trajectory>> work(static_cast<std::size_t>(producers));
  std::mt19937 g(7);
  std::geometric_distribution<rlpt::index_t> resp(1.0 / static_cast<double>(mean_len));
  rlpt::index_t tokens = 0;
  for (rlpt::index_t gr = 0; gr < groups; ++gr)
    for (rlpt::index_t s = 0; s < group_size; ++s) {
      rlpt::trajectory t;
      t.group_id = gr;
      t.sample_index = static_cast<std::int32_t>(s);
      const auto n = static_cast<std::size_t>(2 + resp(g));
      t.prompt_len = 1;
      t.tokens.assign(n, 5);
      t.loss_mask.assign(n, 1);
      t.loss_mask[0] = 0;
      t.logprobs.assign(n, -1.0f);
      t.versions.assign(n, 0);
      t.versions[0] = -1;
      t.rewards = {static_cast<float>(s % 2)};
      tokens += static_cast<rlpt::index_t>(n);
      work[static_cast<std::size_t>(gr % producers)].push_back(std::move(t));
    }
  rlpt::rollout_buffer buf({.capacity_groups = 256, .group_size = group_size});
  std::atomic<rlpt::index_t> consumed{0};
  const std::clock_t c0 = std::clock(); // process CPU time, all threads
  const auto t0 = clock_type::now();
  std::vector<std::thread> threads;
  for (int p = 0; p < producers; ++p)
    threads.emplace_back([&, p] {
      for (auto& t : work[static_cast<std::size_t>(p)]) buf.push(std::move(t));
    });
  for (int c = 0; c < consumers; ++c)
    threads.emplace_back([&] {
      rlpt::rollout_batch b; // reused: a trainer keeps one batch per consumer
      while (buf.pop_into(b, 8)) consumed.fetch_add(b.size(), std::memory_order_relaxed);
    });
  for (int p = 0; p < producers; ++p) threads[static_cast<std::size_t>(p)].join();
  buf.close();
  for (std::size_t t = static_cast<std::size_t>(producers); t < threads.size(); ++t) threads[t].join();
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  const auto st = buf.stats();
  if (!st.balanced() || consumed.load() != records - records % group_size) {
    fmt::print(stderr, "accounting broken: consumed {} of {}\n", consumed.load(), records);
    return 1;
  }
  // Bytes a record's columns occupy (token 4, mask 1, logprob 4, version 4); each is moved in
  // and copied once into the batch columns.
  const double bytes = static_cast<double>(tokens) * 13.0;
  const rlpt::bench::bandwidth bw = rlpt::bench::measure_copy_bandwidth(std::size_t{1} << 28, 3, 1);
  // The same copy per CPU second (robust on a shared machine): bytes read + written / CPU s.
  double copy_cpu_gbps = 0;
  {
    std::vector<char> src(std::size_t{1} << 28, 1), dst(std::size_t{1} << 28, 0);
    for (int r = 0; r < 3; ++r) {
      const double c1 = cpu_now();
      std::memcpy(dst.data(), src.data(), src.size());
      copy_cpu_gbps = std::max(copy_cpu_gbps, 2.0 * static_cast<double>(src.size()) / (cpu_now() - c1) / 1e9);
    }
  }
  fmt::print(
      "{{\"op\": \"buffer\", \"cpu_s\": [{:.9g}], \"wall_s\": [{:.9g}], \"records\": {}, \"tokens\": {}, "
      "\"records_per_s\": "
      "{:.9g}, \"tokens_per_s\": {:.9g}, \"ns_per_record\": {:.9g}, \"cpu_ns_per_record\": {:.9g}, "
      "\"column_gbps\": {:.9g}, \"copy_gbps\": {:.9g}, \"column_cpu_gbps\": {:.9g}, \"copy_cpu_gbps\": {:.9g}}}\n",
      cpu, s, consumed.load(), tokens, static_cast<double>(consumed.load()) / s, static_cast<double>(tokens) / s,
      s * 1e9 / static_cast<double>(consumed.load()), cpu * 1e9 / static_cast<double>(consumed.load()),
      2.0 * bytes / s / 1e9, bw.copy_gbps, 2.0 * bytes / cpu / 1e9, copy_cpu_gbps);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  try {
    const timing_plan plan = rlpt::bench::parse_timing(argc, argv);
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "balance" && argc == 6)
      return balance(argv[2], std::atoll(argv[3]), std::atoi(argv[4]) != 0, argv[5], plan);
    if (mode == "microbatch" && argc == 5) return microbatch(argv[2], std::atoll(argv[3]), argv[4], plan);
    if (mode == "pack" && argc == 5) return pack(argv[2], std::atoll(argv[3]), std::atoll(argv[4]), plan);
    if (mode == "buffer" && argc == 7)
      return buffer(std::atoi(argv[2]), std::atoi(argv[3]), std::atoll(argv[4]), std::atoll(argv[5]),
                    std::atoll(argv[6]));
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_rollout_peer: {}\n", e.what());
    return 1;
  }
  fmt::print(stderr, "usage: see the header of bench/rollout/bench_rollout_peer.cpp\n");
  return 2;
}
