// SPDX-License-Identifier: Apache-2.0
// Weight-sync benchmark runner: each subcommand prints one JSON line. scripts/bench-peers runs
// delta-sim and the peer modes below; tools/golden/gen_sync.py runs write-golden; the others are
// for runs by hand.
//
//   bench_sync_runner shm   TOTAL_MB BUCKET_MB REPS [staged]  shared memory, sender and receiver in two processes
//   bench_sync_runner tcp   TOTAL_MB BUCKET_MB REPS [staged] [auth-control|auth-full]
//                                                          TCP loopback, two processes
//   bench_sync_runner ucx   TOTAL_MB BUCKET_MB REPS [staged] [tls=LIST] [auth-control|auth-full]
//                                                          UCX on loopback (UCX's transports or LIST), two processes
//   bench_sync_runner serve   tcp|ucx HOST PORT VERSIONS [tls=LIST] [auth-control|auth-full]
//   bench_sync_runner publish tcp|ucx HOST PORT TOTAL_MB BUCKET_MB REPS [tls=LIST] [auth-control|auth-full]
//                                                          the two ends on two hosts (bench/sync/netns_pair.sh): serve
//                                                          listens for VERSIONS versions; publish sends 1 + REPS
//   bench_sync_runner delta-sim NUMEL LR STEPS                RL-like bf16 update stream: density, bytes, throughput
//   bench_sync_runner delta-pair FILE REPS                     encode/apply "prev" -> "now" (bf16) from a safetensors file
//   bench_sync_runner st-roundtrip IN OUT REPS                read a safetensors file, write it back (timed)
//   bench_sync_runner write-golden DIR SEED                   files for the Python cross-check
//
// scripts/bench-peers (bench/peers/blocks/sync.py) uses the peer modes, with the timing protocol of
// bench/support/peer_timing.hpp ([timing] = --warmup N --calls N --flush BYTES --out DIR):
//   bench_sync_runner transport-peer shm|tcp TOTAL_MB BUCKET_MB streaming|staged|weights|targets [timing]
//       one call = one dense version; cpu_s: the busier process's CPU seconds for it (sender or
//       receiver); "weights": the receiver's load callback copies every tensor into destination
//       buffers (the engine's weights, allocated and touched beforehand) and checks them at the end
//   bench_sync_runner delta-peer FILE encode|apply [timing]     the "prev" -> "now" pair of FILE;
//       encode allocates its stream per call; --out writes applied.bf16
//   bench_sync_runner st-read-peer FILE [timing]              open + copy every tensor into buffers
//       allocated per call (safetensors.torch.load_file + clone)
//   bench_sync_runner st-write-peer IN OUT [timing]           write IN's tensors to OUT atomically
//
// Every throughput is stated next to the single-thread memcpy rate measured in the same run, in
// wall time and per CPU second ("cpu_" fields: robust when other processes share the cores).
#include "golden_writer.hpp"

#include <rlpt/sync.hpp>
#ifdef RLPT_BENCH_AUTH
#include <rlpt/sync/auth_openssl.hpp>
#endif
#ifdef RLPT_BENCH_UCX
#include <rlpt/sync/ucx.hpp>
#endif

#include "support/bandwidth.hpp"
#include "support/peer_timing.hpp"

#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace rlpt::sync;
using namespace std::chrono_literals;

namespace {

// A loopback TCP port free at the time of asking (bound, read, released).
[[maybe_unused]] std::uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("free_port: no loopback port");
  ::close(fd);
  return ntohs(a.sin_port);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double cpu_clock(clockid_t id) {
  timespec ts{};
  ::clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}
double thread_cpu() { return cpu_clock(CLOCK_THREAD_CPUTIME_ID); }
double process_cpu() { return cpu_clock(CLOCK_PROCESS_CPUTIME_ID); }

// memcpy rate in bytes copied per second (bandwidth.hpp counts read + write: half of it).
double memcpy_gbps() { return rlpt::bench::measure_copy_bandwidth(std::size_t{1} << 30, 5, 1).copy_gbps / 2.0; }

// The same 1 GiB single-thread memcpy, bytes copied per CPU second of this thread (best of 5).
// With `piece` > 0 it copies in pieces of that size: glibc switches to non-temporal stores only
// for copies above x86_non_temporal_threshold (192 MiB here), so 32 MiB pieces (the bench
// model's tensors, which the sender packs one by one) copy with regular stores.
double memcpy_cpu_gbps(std::size_t piece = 0) {
  std::vector<char> src(std::size_t{1} << 30, 1), dst(src.size(), 0);
  if (piece == 0) piece = src.size();
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    const double c0 = thread_cpu();
    for (std::size_t at = 0; at < src.size(); at += piece)
      std::memcpy(dst.data() + at, src.data() + at, std::min(piece, src.size() - at));
    best = std::max(best, static_cast<double>(src.size()) / (thread_cpu() - c0) / 1e9);
  }
  return best;
}

// A "model" of bf16 tensors totalling `total` bytes, tensors of 32 MiB (or fewer bytes).
struct big_model {
  std::vector<std::unique_ptr<std::byte[]>> storage;
  std::vector<tensor_ref> refs;
  explicit big_model(std::uint64_t total) {
    const std::uint64_t per = std::uint64_t{32} << 20;
    std::mt19937_64 g(1);
    for (std::uint64_t at = 0, k = 0; at < total; at += per, ++k) {
      const std::uint64_t n = std::min(per, total - at);
      storage.emplace_back(new std::byte[n]);
      auto* p = reinterpret_cast<std::uint64_t*>(storage.back().get());
      for (std::uint64_t i = 0; i < n / 8; ++i) p[i] = g();
      refs.push_back({fmt::format("layers.{}.weight", k),
                      wire_dtype::bf16,
                      {static_cast<std::int64_t>(n / 2)},
                      storage.back().get()});
    }
  }
};

// Publishes `reps` dense versions from this process to a receiver in a child; returns JSON.
template <class MakeSender, class MakeReceiver>
std::string throughput(const char* what, std::uint64_t total, std::uint64_t bucket, int reps, bool staged,
                       MakeSender&& make_sender_link, MakeReceiver&& make_receiver_link) {
  big_model md(total);
  const manifest m = plan(md.refs, {.bucket_bytes = bucket, .alignment = 256});
  const double copy = memcpy_gbps(), copy_cpu = memcpy_cpu_gbps(),
               copy_piece_cpu = memcpy_cpu_gbps(static_cast<std::size_t>(m[0].nbytes));
  int cpu_pipe[2];
  if (::pipe(cpu_pipe) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(cpu_pipe[0]);
    auto link = make_receiver_link();
    receiver rx(*link, [](const tensor_view&) {},
                {.timeout = 60s, .mode = staged ? apply_mode::staged : apply_mode::streaming, .mirror = staged});
    // Receiver CPU seconds per version after the warm-up one: [0] the mean, [1] the least.
    double c0 = 0, first = 0, cpu[2] = {0, 1e30};
    for (int got = 0; got < reps + 1;) {
      const update u = rx.poll(100ms);
      if (u.failed()) {
        std::fprintf(stderr, "receiver: %s\n", u.reason.c_str());
        ::_exit(1);
      }
      if (!u.published()) continue;
      const double now = process_cpu();
      if (got >= 1)
        cpu[1] = std::min(cpu[1], now - c0);
      else
        first = now;
      c0 = now;
      ++got;
    }
    cpu[0] = (c0 - first) / reps;
    if (::write(cpu_pipe[1], cpu, sizeof cpu) != static_cast<ssize_t>(sizeof cpu)) ::_exit(1);
    ::_exit(0);
  }
  ::close(cpu_pipe[1]);
  auto link = make_sender_link();
  sender tx(*link, m, md.refs, {.timeout = 60s, .commit_timeout = 120s});
  tx.publish(1); // warm-up: first touch of slots and buffers
  double best = 1e30, sum = 0, tx_best = 1e30;
  const double c0 = process_cpu();
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c = process_cpu();
    tx.publish(static_cast<std::uint64_t>(r + 2));
    const double s = seconds_since(t0);
    tx_best = std::min(tx_best, process_cpu() - c);
    best = std::min(best, s);
    sum += s;
  }
  const double tx_cpu = (process_cpu() - c0) / reps;
  int status = 0;
  ::waitpid(child, &status, 0);
  double rx[2] = {0, 0}; // receiver CPU per version: mean, least
  if (::read(cpu_pipe[0], rx, sizeof rx) != static_cast<ssize_t>(sizeof rx)) rx[0] = rx[1] = 0;
  ::close(cpu_pipe[0]);
  const double bytes = static_cast<double>(m.payload_bytes());
  const double gbps = bytes / best / 1e9;
  // With a core per side the two processes pipeline; the slower side's CPU time per version
  // bounds it. Best of the versions, as the memcpy references are best of 5 (the "mean" fields
  // average all versions).
  const double cpu_gbps = rx[1] > 0 ? bytes / std::max(tx_best, rx[1]) / 1e9 : 0.0;
  const double cpu_mean_gbps = rx[0] > 0 ? bytes / std::max(tx_cpu, rx[0]) / 1e9 : 0.0;
  return fmt::format(
      R"({{"bench":"{}","receiver":"{}","total_bytes":{},"bucket_bytes":{},"buckets":{},"reps":{},"best_s":{:.4f},"mean_s":{:.4f},"gbps":{:.3f},"memcpy_gbps":{:.3f},"fraction_of_memcpy":{:.3f},"sender_cpu_s":{:.4f},"receiver_cpu_s":{:.4f},"sender_cpu_mean_s":{:.4f},"receiver_cpu_mean_s":{:.4f},"cpu_gbps":{:.3f},"cpu_mean_gbps":{:.3f},"memcpy_cpu_gbps":{:.3f},"cpu_fraction_of_memcpy":{:.3f},"cpu_mean_fraction_of_memcpy":{:.3f},"memcpy_piece_bytes":{},"memcpy_piece_cpu_gbps":{:.3f},"cpu_fraction_of_piece_memcpy":{:.3f},"receiver_ok":{}}})",
      what, staged ? "staged+mirror" : "streaming", m.payload_bytes(), bucket, m.bucket_count(), reps, best, sum / reps,
      gbps, copy, gbps / copy, tx_best, rx[1], tx_cpu, rx[0], cpu_gbps, cpu_mean_gbps, copy_cpu, cpu_gbps / copy_cpu,
      cpu_mean_gbps / copy_cpu, m[0].nbytes, copy_piece_cpu, cpu_gbps / copy_piece_cpu,
      WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Adam-like RL updates of fp32 master weights, cast to bf16 each step; the bf16 stream is
// delta-encoded against the previous step and applied to a receiver copy.
std::string delta_sim(std::size_t n, double lr, int steps) {
  std::mt19937_64 g(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> w(n), m1(n, 0.f), m2(n, 0.f);
  for (auto& x : w) x = 0.02f * normal(g);
  std::vector<std::byte> prev(n * 2), now(n * 2), rx(n * 2), stream;
  auto cast = [&](std::vector<std::byte>& out) {
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t b = rlpt::bf16(w[i]).bits;
      std::memcpy(&out[i * 2], &b, 2);
    }
  };
  cast(prev);
  rx = prev;
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::uint64_t changed = 0, wire = 0, dense = 0;
  double enc_s = 0, apply_s = 0, hash_s = 0, enc_cpu = 0, apply_cpu = 0;
  const std::uint64_t B = std::uint64_t{512} << 20;
  delta_encoder enc(std::uint64_t{256} << 20);
  for (int t = 1; t <= steps; ++t) {
    const double c1 = 1 - std::pow(b1, t), c2 = 1 - std::pow(b2, t);
    for (std::size_t i = 0; i < n; ++i) { // a "gradient" of unit scale; Adam normalises it to ~lr per element
      const float gi = normal(g);
      m1[i] = static_cast<float>(b1 * m1[i] + (1 - b1) * gi);
      m2[i] = static_cast<float>(b2 * m2[i] + (1 - b2) * gi * gi);
      w[i] -= static_cast<float>(lr * (m1[i] / c1) / (std::sqrt(m2[i] / c2) + eps));
    }
    cast(now);
    stream.clear();
    delta_stats st;
    auto t0 = std::chrono::steady_clock::now();
    double c0 = thread_cpu();
    enc.encode(0, now, prev, 2, 0, B, stream, st);
    enc_s += seconds_since(t0);
    enc_cpu += thread_cpu() - c0;
    t0 = std::chrono::steady_clock::now();
    c0 = thread_cpu();
    for_each_delta_record(stream, "sim", [&](delta_record& r) {
      swap_apply(r, std::span<std::byte>(rx).subspan(r.elem_begin * 2, r.elem_count * 2));
    });
    apply_s += seconds_since(t0);
    apply_cpu += thread_cpu() - c0;
    t0 = std::chrono::steady_clock::now();
    const std::uint64_t check = tensor_checksum(rx.data(), rx.size(), B); // the receiver's checksum after apply
    hash_s += seconds_since(t0);
    if (check != tensor_checksum(now.data(), now.size(), B) || std::memcmp(rx.data(), now.data(), now.size()) != 0) {
      std::fprintf(stderr, "delta-sim: receiver copy differs at step %d\n", t);
      std::exit(1);
    }
    changed += st.changed;
    wire += st.bytes;
    dense += st.dense_bytes;
    std::swap(prev, now);
  }
  const double bytes = static_cast<double>(dense);
  return fmt::format(
      R"({{"bench":"delta-sim","numel":{},"lr":{},"steps":{},"changed_fraction":{:.5f},"wire_bytes":{},"dense_bytes":{},"reduction":{:.1f},"encode_gbps":{:.3f},"apply_gbps":{:.3f},"apply_plus_checksum_gbps":{:.3f},"memcpy_gbps":{:.3f},"encode_cpu_gbps":{:.3f},"apply_cpu_gbps":{:.3f},"memcpy_cpu_gbps":{:.3f}}})",
      n, lr, steps, static_cast<double>(changed) / static_cast<double>(n) / steps, wire, dense,
      static_cast<double>(dense) / static_cast<double>(std::max<std::uint64_t>(wire, 1)), bytes / enc_s / 1e9,
      bytes / apply_s / 1e9, bytes / (apply_s + hash_s) / 1e9, memcpy_gbps(), bytes / enc_cpu / 1e9,
      bytes / apply_cpu / 1e9, memcpy_cpu_gbps());
}

// Times encode and apply of the delta between tensors "prev" and "now" of a safetensors file
// (scripts/bench-peers times the same pair with delta-peer, against torch).
std::string delta_pair(const std::string& path, int reps) {
  const safetensors_file f(path);
  const tensor_view prev = f.tensor("prev"), now = f.tensor("now");
  const std::size_t eb = size_of(now.dtype);
  const std::uint64_t B = std::uint64_t{512} << 20;
  delta_encoder enc(std::uint64_t{256} << 20);
  std::vector<std::byte> stream, target(prev.bytes.begin(), prev.bytes.end());
  double enc_best = 1e30, apply_best = 1e30, enc_cpu = 1e30, apply_cpu = 1e30;
  delta_stats st;
  for (int r = 0; r < reps; ++r) {
    stream.clear();
    st = {};
    auto t0 = std::chrono::steady_clock::now();
    double c0 = thread_cpu();
    enc.encode(0, now.bytes, prev.bytes, eb, 0, B, stream, st);
    enc_best = std::min(enc_best, seconds_since(t0));
    enc_cpu = std::min(enc_cpu, thread_cpu() - c0);
    std::memcpy(target.data(), prev.bytes.data(), target.size());
    t0 = std::chrono::steady_clock::now();
    c0 = thread_cpu();
    for_each_delta_record(stream, "pair", [&](delta_record& rec) {
      swap_apply(rec, std::span<std::byte>(target).subspan(rec.elem_begin * eb, rec.elem_count * eb));
    });
    apply_best = std::min(apply_best, seconds_since(t0));
    apply_cpu = std::min(apply_cpu, thread_cpu() - c0);
    if (std::memcmp(target.data(), now.bytes.data(), target.size()) != 0) throw std::runtime_error("apply mismatch");
  }
  const double bytes = static_cast<double>(now.bytes.size());
  return fmt::format(
      R"({{"bench":"delta-pair","bytes":{},"changed":{},"wire_bytes":{},"encode_s":{:.5f},"apply_s":{:.5f},"encode_gbps":{:.3f},"apply_gbps":{:.3f},"encode_cpu_s":{:.5f},"apply_cpu_s":{:.5f},"sparse":{},"bitmap":{},"dense":{},"memcpy_gbps":{:.3f},"memcpy_cpu_gbps":{:.3f}}})",
      now.bytes.size(), st.changed, st.bytes, enc_best, apply_best, bytes / enc_best / 1e9, bytes / apply_best / 1e9,
      enc_cpu, apply_cpu, st.by_encoding[1], st.by_encoding[2], st.by_encoding[3], memcpy_gbps(), memcpy_cpu_gbps());
}

// Reads a safetensors file into owned buffers (what safetensors.torch.load_file does), then
// writes the same tensors back atomically; best of `reps`.
std::string st_roundtrip(const std::string& in, const std::string& out, int reps) {
  double read_best = 1e30, write_best = 1e30;
  std::uint64_t bytes = 0;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<std::byte>> owned;
    std::vector<tensor_ref> refs;
    safetensors_metadata meta;
    {
      const safetensors_file f(in);
      meta = f.header().metadata;
      owned.reserve(f.header().tensors.size());
      for (const auto& e : f.header().tensors) {
        const tensor_view t = f.view(e);
        owned.emplace_back(t.bytes.size());
        if (!t.bytes.empty()) std::memcpy(owned.back().data(), t.bytes.data(), t.bytes.size());
        refs.push_back({e.name, e.dtype, e.shape, owned.back().data()});
      }
      bytes = f.header().data_bytes;
    }
    read_best = std::min(read_best, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    write_safetensors(out, refs, meta);
    write_best = std::min(write_best, seconds_since(t0));
  }
  return fmt::format(
      R"({{"bench":"st-roundtrip","bytes":{},"read_s":{:.4f},"write_s":{:.4f},"read_gbps":{:.3f},"write_gbps":{:.3f},"memcpy_gbps":{:.3f}}})",
      bytes, read_best, write_best, static_cast<double>(bytes) / read_best / 1e9,
      static_cast<double>(bytes) / write_best / 1e9, memcpy_gbps());
}

// --- scripts/bench-peers modes -------------------------------------------------------------------

int usage();

// One dense version per call, sender here, receiver in a child process; per version the CPU
// seconds of each process (the receiver's travel back through a pipe at the end).
template <class MakeSender, class MakeReceiver>
std::string transport_peer(const char* what, std::uint64_t total, std::uint64_t bucket, const std::string& mode,
                           const rlpt::bench::timing_plan& tp, MakeSender&& make_sender_link,
                           MakeReceiver&& make_receiver_link) {
  big_model md(total);
  const manifest m = plan(md.refs, {.bucket_bytes = bucket, .alignment = 256});
  const int versions = tp.warmup + tp.calls;
  int cpu_pipe[2];
  if (::pipe(cpu_pipe) != 0) throw std::runtime_error("pipe failed");
  std::fflush(nullptr);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(cpu_pipe[0]);
    // The engine's weights exist before the update: allocated and touched up front.
    std::vector<std::unique_ptr<std::byte[]>> dest;
    std::vector<std::string> names;
    const bool into_weights = mode == "weights" || mode == "targets";
    if (into_weights)
      for (const auto& r : md.refs) {
        const std::size_t n = static_cast<std::size_t>(r.shape[0]) * 2;
        dest.emplace_back(new std::byte[n]);
        std::memset(dest.back().get(), 0, n);
        names.emplace_back(r.name);
      }
    auto load = [&](const tensor_view& t) {
      if (mode != "weights") return;
      const auto it = std::find(names.begin(), names.end(), t.name);
      if (it == names.end()) ::_exit(3);
      std::memcpy(dest[static_cast<std::size_t>(it - names.begin())].get(), t.bytes.data(), t.bytes.size());
    };
    // targets: the receiver writes the weights itself (copy_hash from the slot, one pass);
    // weights: the load callback copies each verified tensor out of the slot.
    std::vector<tensor_target> targets;
    if (mode == "targets")
      for (std::size_t i = 0; i < dest.size(); ++i)
        targets.push_back({md.refs[i].name, md.refs[i].dtype, md.refs[i].shape, dest[i].get()});
    auto link = make_receiver_link();
    const receiver_options ro{.timeout = 60s,
                              .mode = mode == "staged" ? apply_mode::staged : apply_mode::streaming,
                              .mirror = mode == "staged"};
    receiver rx = mode == "targets" ? receiver(*link, std::move(targets), {}, ro) : receiver(*link, load, ro);
    std::vector<double> cpu;
    double c0 = process_cpu();
    for (int got = 0; got < versions;) {
      const update u = rx.poll(100ms);
      if (u.failed()) {
        std::fprintf(stderr, "receiver: %s\n", u.reason.c_str());
        ::_exit(1);
      }
      if (!u.published()) continue;
      const double now = process_cpu();
      cpu.push_back(now - c0);
      c0 = now;
      ++got;
    }
    double ok = 1.0;
    for (std::size_t i = 0; i < dest.size(); ++i)
      if (std::memcmp(dest[i].get(), md.refs[i].data, static_cast<std::size_t>(md.refs[i].shape[0]) * 2) != 0) ok = 0.0;
    cpu.push_back(ok);
    const auto bytes = static_cast<ssize_t>(cpu.size() * sizeof(double));
    if (::write(cpu_pipe[1], cpu.data(), static_cast<std::size_t>(bytes)) != bytes) ::_exit(1);
    ::_exit(0);
  }
  ::close(cpu_pipe[1]);
  auto link = make_sender_link();
  sender tx(*link, m, md.refs, {.timeout = 60s, .commit_timeout = 120s});
  std::vector<double> tx_cpu, wall;
  for (int v = 0; v < versions; ++v) {
    const double w0 = rlpt::bench::wall_seconds(), c0 = process_cpu();
    tx.publish(static_cast<std::uint64_t>(v + 1));
    tx_cpu.push_back(process_cpu() - c0);
    wall.push_back(rlpt::bench::wall_seconds() - w0);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  std::vector<double> rx(static_cast<std::size_t>(versions) + 1, 0.0);
  const auto want = static_cast<ssize_t>(rx.size() * sizeof(double));
  const bool got = ::read(cpu_pipe[0], rx.data(), static_cast<std::size_t>(want)) == want;
  ::close(cpu_pipe[0]);
  rlpt::bench::call_times t;
  std::vector<double> tx_t, rx_t;
  for (int v = tp.warmup; v < versions; ++v) {
    const auto k = static_cast<std::size_t>(v);
    t.cpu.push_back(std::max(tx_cpu[k], rx[k]));
    t.wall.push_back(wall[k]);
    tx_t.push_back(tx_cpu[k]);
    rx_t.push_back(rx[k]);
  }
  const bool ok = got && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return fmt::format(R"({{"bench": "{}", "receiver": "{}", "bytes": {}, "bucket_bytes": {}, "receiver_ok": {}, )"
                     R"("weights_ok": {}, {}, "sender_cpu_s": {}, "receiver_cpu_s": {}}})",
                     what, mode, m.payload_bytes(), bucket, ok,
                     ok && (mode == "weights" || mode == "targets") && rx.back() == 1.0, rlpt::bench::json_series(t),
                     rlpt::bench::json_array(tx_t), rlpt::bench::json_array(rx_t));
}

std::string delta_peer(const std::string& path, const std::string& what, const rlpt::bench::timing_plan& tp) {
  const safetensors_file f(path);
  const tensor_view prev = f.tensor("prev"), now = f.tensor("now");
  const std::size_t eb = size_of(now.dtype);
  const std::uint64_t B = std::uint64_t{512} << 20;
  delta_encoder enc(std::uint64_t{256} << 20);
  auto encode = [&] { // the stream is the call's output, allocated per call (torch allocates its index and values)
    std::vector<std::byte> stream;
    delta_stats st;
    enc.encode(0, now.bytes, prev.bytes, eb, 0, B, stream, st);
    return std::make_pair(std::move(stream), st);
  };
  auto [stream, stats] = encode();
  std::vector<std::byte> target(prev.bytes.begin(), prev.bytes.end());
  auto apply = [&] { // in place, as index_copy_; each call swaps the changed values (now <-> prev)
    for_each_delta_record(stream, "peer", [&](delta_record& rec) {
      swap_apply(rec, std::span<std::byte>(target).subspan(rec.elem_begin * eb, rec.elem_count * eb));
    });
  };
  rlpt::bench::call_times t;
  if (what == "encode") {
    t = rlpt::bench::time_calls(tp, encode);
  } else {
    t = rlpt::bench::time_calls(tp, apply);
    if ((tp.warmup + tp.calls) % 2 == 0) apply(); // an odd number of applies leaves "now" in target
  }
  if (!tp.out.empty()) {
    if (what == "encode") {
      std::memcpy(target.data(), prev.bytes.data(), target.size());
      auto [s2, st2] = encode();
      stream = std::move(s2);
      apply();
    }
    rlpt::bench::write_raw(tp.out + "/applied.bf16", target.data(), target.size());
  }
  return fmt::format(R"({{"bench": "delta-peer", "what": "{}", "bytes": {}, "changed": {}, "wire_bytes": {}, {}}})",
                     what, now.bytes.size(), stats.changed, stats.bytes, rlpt::bench::json_series(t));
}

std::string st_read_peer(const std::string& path, const rlpt::bench::timing_plan& tp) {
  auto read = [&] { // open + copy every tensor into memory the caller owns (allocated here)
    std::vector<std::unique_ptr<std::byte[]>> owned;
    const safetensors_file f(path);
    for (const auto& e : f.header().tensors) {
      const auto n = static_cast<std::size_t>(e.end - e.begin);
      owned.emplace_back(new std::byte[std::max<std::size_t>(n, 1)]);
      f.read(e, {owned.back().get(), n});
    }
    return owned;
  };
  const auto t = rlpt::bench::time_calls(tp, read);
  // checksum: the 64-bit little-endian words of every tensor's bytes, summed (the harness sums the
  // same words of Python's tensors)
  std::uint64_t sum = 0, bytes = 0;
  {
    const safetensors_file f(path);
    const auto owned = read();
    for (std::size_t i = 0; i < f.header().tensors.size(); ++i) {
      const std::size_t n = f.view(f.header().tensors[i]).bytes.size();
      bytes += n;
      for (std::size_t k = 0; k + 8 <= n; k += 8) {
        std::uint64_t w;
        std::memcpy(&w, owned[i].get() + k, 8);
        sum += w;
      }
    }
  }
  return fmt::format(R"({{"bench": "st-read-peer", "bytes": {}, "checksum": "{}", {}}})", bytes, sum,
                     rlpt::bench::json_series(t));
}

std::string st_write_peer(const std::string& in, const std::string& out, const rlpt::bench::timing_plan& tp) {
  const safetensors_file f(in);
  std::vector<tensor_ref> refs;
  for (const auto& e : f.header().tensors) {
    const tensor_view t = f.view(e);
    refs.push_back({e.name, e.dtype, e.shape, t.bytes.data()});
  }
  const auto t = rlpt::bench::time_calls(tp, [&] { write_safetensors(out, refs, f.header().metadata); });
  return fmt::format(R"({{"bench": "st-write-peer", "bytes": {}, {}}})", f.header().data_bytes,
                     rlpt::bench::json_series(t));
}

int peer_modes(int argc, char** argv) {
  const rlpt::bench::timing_plan tp = rlpt::bench::parse_timing(argc, argv);
  const std::string cmd = argv[1];
  if (cmd == "transport-peer" && argc == 6) {
    const std::string kind = argv[2], mode = argv[5];
    const std::uint64_t total = std::stoull(argv[3]) << 20, bucket = std::stoull(argv[4]) << 20;
    if (mode != "streaming" && mode != "staged" && mode != "weights" && mode != "targets") return usage();
    if (kind == "shm") {
      const std::string name = fmt::format("rlpt-bench-{}", ::getpid());
      std::puts(
          transport_peer(
              "shm", total, bucket, mode, tp,
              [&] { return std::make_unique<shm_transport>(name, role::sender, shm_options{.slot_bytes = bucket}); },
              [&] { return std::make_unique<shm_transport>(name, role::receiver); })
              .c_str());
      return 0;
    }
    if (kind == "tcp") {
      auto listener = std::make_unique<tcp_transport>(tcp_options{.listen = true}, role::receiver);
      const std::uint16_t port = listener->port();
      std::puts(transport_peer(
                    "tcp", total, bucket, mode, tp,
                    [&] { return std::make_unique<tcp_transport>(tcp_options{.port = port}, role::sender); },
                    [&] { return std::move(listener); })
                    .c_str());
      return 0;
    }
  }
  if (cmd == "delta-peer" && argc == 4) {
    std::puts(delta_peer(argv[2], argv[3], tp).c_str());
    return 0;
  }
  if (cmd == "st-read-peer" && argc == 3) {
    std::puts(st_read_peer(argv[2], tp).c_str());
    return 0;
  }
  if (cmd == "st-write-peer" && argc == 4) {
    std::puts(st_write_peer(argv[2], argv[3], tp).c_str());
    return 0;
  }
  return usage();
}

// The two ends of a cross-host run (netns_pair.sh): a link of `kind` on HOST:PORT, listening
// (receiver) or connecting (sender). Plain links opt out of authentication: the bench's hosts
// are namespaces on one machine.
std::unique_ptr<rlpt::sync::link> host_link(const std::string& kind, const std::string& host, std::uint16_t port,
                                            bool listen, const std::string& tls,
                                            std::shared_ptr<const authenticator> auth, integrity tags) {
  const role r = listen ? role::receiver : role::sender;
  if (kind == "tcp") {
    static_cast<void>(tls);
    return std::make_unique<tcp_transport>(tcp_options{.host = host,
                                                       .port = port,
                                                       .listen = listen,
                                                       .auth = auth,
                                                       .tags = tags,
                                                       .allow_unauthenticated = auth == nullptr},
                                           r);
  }
#ifdef RLPT_BENCH_UCX
  if (kind == "ucx")
    return std::make_unique<ucx_transport>(ucx_options{.host = host,
                                                       .port = port,
                                                       .listen = listen,
                                                       .transports = tls,
                                                       .auth = auth,
                                                       .tags = tags,
                                                       .allow_unauthenticated = auth == nullptr},
                                           r);
#endif
  throw std::runtime_error(fmt::format("no transport \"{}\" in this build", kind));
}

// serve: receives `versions` dense versions, streaming (as bench throughput), checking every piece.
std::string serve(std::unique_ptr<rlpt::sync::link> l, int versions) {
  receiver rx(*l, [](const tensor_view&) {}, {.timeout = 60s, .mode = apply_mode::streaming, .mirror = false});
  for (int got = 0; got < versions;) {
    const update u = rx.poll(100ms);
    if (u.failed()) throw std::runtime_error("receiver: " + u.reason);
    if (u.published()) ++got;
  }
  return fmt::format(R"({{"bench":"serve","link":"{}","versions":{}}})", l->info().name, versions);
}

// publish: 1 warm-up version, then `reps` timed ones; seconds per version, wall and CPU.
std::string publish(std::unique_ptr<rlpt::sync::link> l, std::uint64_t total, std::uint64_t bucket, int reps) {
  big_model md(total);
  const manifest m = plan(md.refs, {.bucket_bytes = bucket, .alignment = 256});
  sender tx(*l, m, md.refs, {.timeout = 60s, .commit_timeout = 120s});
  tx.publish(1);
  std::vector<double> wall;
  const double c0 = process_cpu();
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    tx.publish(static_cast<std::uint64_t>(r + 2));
    wall.push_back(seconds_since(t0));
  }
  const double cpu = (process_cpu() - c0) / reps;
  std::string each;
  for (const double w : wall) each += fmt::format("{}{:.4f}", each.empty() ? "" : ",", w);
  std::sort(wall.begin(), wall.end());
  const double bytes = static_cast<double>(m.payload_bytes()), median = wall[wall.size() / 2];
  return fmt::format(
      R"({{"bench":"publish","link":"{}","total_bytes":{},"bucket_bytes":{},"reps":{},"median_s":{:.4f},"best_s":{:.4f},"worst_s":{:.4f},"gbps":{:.3f},"sender_cpu_s":{:.4f},"each_s":[{}]}})",
      l->info().name, m.payload_bytes(), bucket, reps, median, wall.front(), wall.back(), bytes / median / 1e9, cpu,
      each);
}

int host_modes(int argc, char** argv) {
  const std::string cmd = argv[1], kind = argv[2], host = argv[3];
  const auto port = static_cast<std::uint16_t>(std::stoi(argv[4]));
  const int fixed = cmd == "serve" ? 6 : 8;
  if (argc < fixed) return usage();
  std::string tls;
  std::shared_ptr<const authenticator> auth;
  integrity tags = integrity::full;
  for (int a = fixed; a < argc; ++a) {
    const std::string opt = argv[a];
    if (opt.starts_with("tls=")) {
      tls = opt.substr(4);
    } else if (opt == "auth-control" || opt == "auth-full") {
#ifdef RLPT_BENCH_AUTH
      auth = openssl_authenticator::from_string("bench secret: 32 bytes, not a real one");
      tags = opt == "auth-full" ? integrity::full : integrity::control;
#else
      return usage();
#endif
    } else {
      return usage();
    }
  }
  if (cmd == "serve") {
    std::puts(serve(host_link(kind, host, port, true, tls, auth, tags), std::stoi(argv[5])).c_str());
  } else {
    std::puts(publish(host_link(kind, host, port, false, tls, auth, tags), std::stoull(argv[5]) << 20,
                      std::stoull(argv[6]) << 20, std::stoi(argv[7]))
                  .c_str());
  }
  return 0;
}

int usage() {
  std::fprintf(
      stderr,
      "usage: bench_sync_runner shm|tcp|ucx TOTAL_MB BUCKET_MB REPS [staged] [tls=LIST] [auth-control|auth-full] | "
      "delta-sim NUMEL LR STEPS | "
      "delta-pair FILE REPS | st-roundtrip IN OUT REPS | write-golden DIR SEED\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string cmd = argv[1];
  try {
    if (cmd.ends_with("-peer")) return peer_modes(argc, argv);
    if ((cmd == "serve" || cmd == "publish") && argc >= 6) return host_modes(argc, argv);
    if ((cmd == "shm" || cmd == "tcp" || cmd == "ucx") && argc >= 5) {
      const std::uint64_t total = std::stoull(argv[2]) << 20, bucket = std::stoull(argv[3]) << 20;
      const int reps = std::stoi(argv[4]);
      bool staged = false;
      std::shared_ptr<const authenticator> auth; // tcp: authenticated (auth.hpp), frame tags as named
      integrity tags = integrity::full;
      std::string tls; // ucx: UCX_TLS for both ends
      for (int a = 5; a < argc; ++a) {
        const std::string opt = argv[a];
        if (opt == "staged") {
          staged = true;
        } else if (opt.starts_with("tls=")) {
          tls = opt.substr(4);
        } else if (opt == "auth-control" || opt == "auth-full") {
#ifdef RLPT_BENCH_AUTH
          auth = openssl_authenticator::from_string("bench secret: 32 bytes, not a real one");
          tags = opt == "auth-full" ? integrity::full : integrity::control;
#else
          std::fprintf(stderr, "bench_sync_runner: built without the auth component (OpenSSL)\n");
          return 2;
#endif
        } else {
          return usage();
        }
      }
      if (cmd == "ucx") {
#ifdef RLPT_BENCH_UCX
        // The receiver listens in the child, created after the fork (UCX's process state does
        // not survive one), on a port picked free beforehand; the sender connects (and retries).
        const std::uint16_t port = free_port();
        const std::string what = fmt::format("ucx{}{}", tls.empty() ? "" : "[" + tls + "]",
                                             auth == nullptr           ? ""
                                             : tags == integrity::full ? "+auth-full"
                                                                       : "+auth-control");
        std::puts(throughput(
                      what.c_str(), total, bucket, reps, staged,
                      [&] {
                        return std::make_unique<ucx_transport>(
                            ucx_options{.port = port, .transports = tls, .auth = auth, .tags = tags}, role::sender);
                      },
                      [&] {
                        return std::make_unique<ucx_transport>(
                            ucx_options{.port = port, .listen = true, .transports = tls, .auth = auth, .tags = tags},
                            role::receiver);
                      })
                      .c_str());
#else
        std::fprintf(stderr, "bench_sync_runner: built without the ucx component (UCX)\n");
        return 2;
#endif
      } else if (cmd == "shm") {
        const std::string name = fmt::format("rlpt-bench-{}", ::getpid());
        std::puts(
            throughput(
                "shm", total, bucket, reps, staged,
                [&] { return std::make_unique<shm_transport>(name, role::sender, shm_options{.slot_bytes = bucket}); },
                [&] { return std::make_unique<shm_transport>(name, role::receiver); })
                .c_str());
      } else {
        if (auth != nullptr) { // the tag primitive alone, one thread: the ceiling of integrity::full
          std::vector<std::byte> buf(std::size_t{64} << 20, std::byte{1});
          const authenticator::mac k{};
          double best = 1e30;
          for (int r = 0; r < 5; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            static_cast<void>(auth->frame_tag(k, static_cast<std::uint64_t>(r), {std::span<const std::byte>(buf)}));
            best = std::min(best, seconds_since(t0));
          }
          std::printf("{\"bench\":\"frame_tag\",\"what\":\"%s\",\"bytes\":%zu,\"gbps\":%.3f}\n",
                      auth->describe().c_str(), buf.size(), static_cast<double>(buf.size()) / best / 1e9);
        }
        auto listener =
            std::make_unique<tcp_transport>(tcp_options{.listen = true, .auth = auth, .tags = tags}, role::receiver);
        const std::uint16_t port = listener->port();
        const char* what = auth == nullptr ? "tcp" : tags == integrity::full ? "tcp+auth-full" : "tcp+auth-control";
        std::puts(throughput(
                      what, total, bucket, reps, staged,
                      [&] {
                        return std::make_unique<tcp_transport>(tcp_options{.port = port, .auth = auth, .tags = tags},
                                                               role::sender);
                      },
                      [&] { return std::move(listener); })
                      .c_str());
      }
      return 0;
    }
    if (cmd == "delta-sim" && argc >= 5) {
      std::puts(delta_sim(std::stoull(argv[2]), std::stod(argv[3]), std::stoi(argv[4])).c_str());
      return 0;
    }
    if (cmd == "delta-pair" && argc >= 4) {
      std::puts(delta_pair(argv[2], std::stoi(argv[3])).c_str());
      return 0;
    }
    if (cmd == "st-roundtrip" && argc >= 5) {
      std::puts(st_roundtrip(argv[2], argv[3], std::stoi(argv[4])).c_str());
      return 0;
    }
    if (cmd == "write-golden" && argc >= 4) {
      const auto files = rlpt::test::sync::write_golden_files(argv[2], std::stoull(argv[3]));
      std::string list;
      for (const auto& f : files) list += fmt::format("{}\"{}\"", list.empty() ? "" : ",", f);
      std::printf("{\"files\":[%s]}\n", list.c_str());
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sync_runner: %s\n", e.what());
    return 1;
  }
  return usage();
}
