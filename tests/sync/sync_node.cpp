// SPDX-License-Identifier: Apache-2.0
// One host of the namespaced-cluster test (netns_cluster.sh): a trainer that publishes seeded
// model versions, an inference host that receives them (and may forward them) and checks every
// published version bit-exact, or a relay on a host between two others (relay.hpp): a hostile
// network, or a man in the middle that alters frames. Prints a line per event (flushed) and a
// summary line last; exits 0 when everything it was asked to do happened.
//
//   sync_node send HOST PORT VERSIONS SEED [options]      publishes versions --first..VERSIONS
//   sync_node recv HOST PORT VERSIONS SEED [options]      until it holds version VERSIONS
//   sync_node forward HOST PORT VERSIONS SEED [options] --to HOST:PORT...
//                                                         recv, passing every version on (forward.hpp)
//   sync_node relay HOST PORT TARGET_HOST:PORT SEED [--tamper manifest|piece]... [--timeout-s S]
//                                                         until SIGTERM or S seconds
//
// Options: --listen, --secret-env VAR (the job's secret, from that environment variable),
// --insecure (no secret on a non-loopback address), --tags full|control, --timeout-s S (recv:
// overall limit), --layers N, --extra-kib K (one more bf16 tensor of K KiB), --change F (the
// fraction of elements each version changes, 0.02), --first V, --retries N (publish attempts
// per version), --retry-pause-ms MS, --version-pause-ms MS (between versions), --step-timeout-ms MS (sender_options::timeout or
// receiver_options::timeout), --commit-timeout-ms MS (sender_options::commit_timeout),
// --socket-buffer-kib K (tcp_options::socket_buffer), --dead-peer-ms MS
// (tcp_options::dead_peer_timeout), --bucket-kib K (plan buckets, 4 KiB by
// default: many buckets, to exercise the protocol), --transport tcp|ucx (ucx: ucx_transport over
// UCX's TCP transport, or --ucx-tls LIST; where sync_node was built with component ucx),
// --store-and-forward (forward: pass versions on once published, not frames as they arrive).
//
// relay: without --tamper a chaos_relay (5 ms per chunk, stalls, reset connections); with it a
// frame_relay that alters one frame of the k-th update attempt as the k-th --tamper says (cycling):
// `manifest` swaps the names of two tensors of the same dtype and shape in BEGIN's manifest and
// recomputes its layout hash; `piece` flips a byte of the first BUCKET's (or DELTA's) payload and
// recomputes that piece's (chunk's) XXH3 in the frame body. Both re-seal the frame checksum and
// the TCP frame checks: only the frame tag (GMAC under the session key) can tell.
#include "relay.hpp"
#include "sync_support.hpp"

#include <rlpt/sync/auth_openssl.hpp>
#include <rlpt/sync/forward.hpp>
#ifdef RLPT_SYNC_NODE_UCX
#include <rlpt/sync/ucx.hpp>
#endif

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

namespace {

struct model_options {
  int layers = 3;
  std::int64_t extra_kib = 0;
  double change = 0.02;
};
model_options shape;

// Version `v`'s step on top of version v - 1 (the same draws as model_at).
void step_to(model& md, std::uint64_t v) {
  rlpt::test::rng r(2000 + v);
  md.step(shape.change, r);
}

// The model at version v (model_at(seed, v, 2000, layers) with the defaults).
model model_v(std::uint64_t seed, std::uint64_t v) {
  model md = make_model(seed, shape.layers);
  if (shape.extra_kib > 0) {
    rlpt::test::rng r(seed + 1);
    md.add("model.extra.weight", wire_dtype::bf16, {shape.extra_kib, 512}, r);
  }
  for (std::uint64_t k = 2; k <= v; ++k) step_to(md, k);
  return md;
}

double wall_now() { return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count(); }

int usage() {
  std::fprintf(stderr,
               "usage: sync_node send|recv|forward HOST PORT VERSIONS SEED [options]\n"
               "       sync_node relay HOST PORT TARGET_HOST:PORT SEED [--tamper manifest|piece]... [--timeout-s S]\n"
               "(see sync_node.cpp for the options)\n");
  return 2;
}

// Alters frames as `relay --tamper` says (see the file comment): the k-th update attempt the
// relay sees (its BEGIN) gets the k-th alteration of the plan (cycling), one frame each.
class tamperer {
public:
  explicit tamperer(std::vector<std::string> plan) : plan_(std::move(plan)) {}

  void operator()(std::size_t connection, std::size_t, std::vector<std::byte>& meta, std::vector<std::byte>& payload) {
    frame f;
    try {
      f = decode_frame(meta, "relay");
    } catch (const rlpt::error&) {
      return;
    }
    if (f.type == frame_type::begin) {
      what_ = plan_[begins_++ % plan_.size()];
      done_ = false;
      manifest_.reset();
      try {
        manifest_ = manifest::from_json(as_chars(f.body));
      } catch (const rlpt::error&) {}
    }
    if (done_) return;
    if (what_ == "manifest" && f.type == frame_type::begin && manifest_) {
      std::vector<tensor_entry> t(manifest_->tensors().begin(), manifest_->tensors().end());
      for (std::size_t i = 0; i + 1 < t.size() && !done_; ++i)
        for (std::size_t j = i + 1; j < t.size() && !done_; ++j)
          if (t[i].dtype == t[j].dtype && t[i].shape == t[j].shape && t[i].nbytes > 0) {
            log(fmt::format("connection {}: BEGIN of version {}: swapped the names \"{}\" and \"{}\", layout hash "
                            "recomputed",
                            connection, f.version, t[i].name, t[j].name));
            std::swap(t[i].name, t[j].name);
            done_ = true;
          }
      if (!done_) return;
      manifest altered(std::move(t), manifest_->bucket_bytes(), manifest_->alignment());
      altered.set_versions(manifest_->version(), manifest_->base_version());
      const std::string body = altered.to_json();
      std::vector<std::byte> out;
      encode_frame(out, f.type, f.tag, f.version, f.base_version, f.index, altered.layout_hash(), f.payload_bytes,
                   as_bytes(body));
      meta = std::move(out);
    } else if (what_ == "piece" && f.type == frame_type::bucket && manifest_ && f.index < manifest_->bucket_count() &&
               !payload.empty()) {
      const auto pieces = manifest_->pieces(f.index);
      for (std::size_t j = 0; j < pieces.size() && !done_; ++j) {
        const piece& p = pieces[j];
        if (p.nbytes == 0 || (j + 1) * 8 > f.body.size() || p.bucket_offset + p.nbytes > payload.size()) continue;
        payload[static_cast<std::size_t>(p.bucket_offset)] ^= std::byte{0x40};
        const std::uint64_t sum = xxh3(payload.data() + p.bucket_offset, static_cast<std::size_t>(p.nbytes));
        std::memcpy(meta.data() + frame_header_bytes + j * 8, &sum, 8);
        reseal(meta);
        log(fmt::format("connection {}: bucket {} of version {}: flipped a byte of tensor \"{}\", piece checksum "
                        "recomputed",
                        connection, f.index, f.version, (*manifest_)[p.tensor].name));
        done_ = true;
      }
    } else if (what_ == "piece" && f.type == frame_type::delta && !payload.empty() && f.body.size() == 8) {
      payload.back() ^= std::byte{0x40};
      const std::uint64_t sum = xxh3(payload.data(), payload.size());
      std::memcpy(meta.data() + frame_header_bytes, &sum, 8);
      reseal(meta);
      log(fmt::format("connection {}: delta chunk {} of version {}: flipped a byte, chunk checksum recomputed",
                      connection, f.index, f.version));
      done_ = true;
    }
  }

  [[nodiscard]] int altered() const { return altered_; }

private:
  void log(const std::string& s) {
    ++altered_;
    std::printf("altered: %s\n", s.c_str());
  }

  std::vector<std::string> plan_;
  std::size_t begins_ = 0;
  std::string what_;
  bool done_ = true;
  std::optional<manifest> manifest_;
  int altered_ = 0;
};

int relay_main(const std::string& host, std::uint16_t port, const std::string& target, std::uint64_t seed,
               const std::vector<std::string>& tamper, double lifetime_s) {
  // SIGTERM / SIGINT end the relay: blocked here (every relay thread inherits the mask) and
  // taken with sigtimedwait below.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  auto wait_for_stop = [&] {
    const auto ns = static_cast<long long>(lifetime_s * 1e9);
    const timespec limit{static_cast<time_t>(ns / 1'000'000'000), static_cast<long>(ns % 1'000'000'000)};
    for (;;) {
      const int s = sigtimedwait(&stop, nullptr, &limit);
      if (s >= 0 || errno == EAGAIN) return;
    }
  };
  const endpoint at{host, port}, to = endpoint::parse(target);
  if (tamper.empty()) {
    chaos_relay net(to, {}, seed, at);
    net.start();
    std::printf("relaying %s:%u -> %s with 5 ms per chunk, stalls and resets\n", host.c_str(), port, target.c_str());
    wait_for_stop();
    net.stop();
    std::printf("relayed %d connections, %d chunks: %d resets, %d stalls\n", net.connections(), net.chunks(),
                net.resets(), net.stalls());
    return 0;
  }
  tamperer edit(tamper);
  frame_relay mitm(
      to, [&](std::size_t c, std::size_t i, std::vector<std::byte>& m, std::vector<std::byte>& p) { edit(c, i, m, p); },
      at);
  mitm.start();
  std::printf("relaying %s:%u -> %s, altering frames\n", host.c_str(), port, target.c_str());
  wait_for_stop();
  mitm.stop();
  std::printf("relayed %d connections, altered %d frames\n", mitm.connections(), edit.altered());
  return 0;
}

} // namespace

// A link of the chosen transport with tcp_options' settings, and its authentication counters.
struct node_link {
  std::unique_ptr<rlpt::sync::link> link;
  const auth_counters* counters = nullptr;
};

node_link open_link(const std::string& transport, const std::string& ucx_tls, const tcp_options& o, role r) {
  if (transport == "ucx") {
#ifdef RLPT_SYNC_NODE_UCX
    auto l = std::make_unique<ucx_transport>(ucx_options{.host = o.host,
                                                         .port = o.port,
                                                         .listen = o.listen,
                                                         .transports = ucx_tls,
                                                         .auth = o.auth,
                                                         .tags = o.tags,
                                                         .allow_unauthenticated = o.allow_unauthenticated},
                                             r);
    const auth_counters* c = &l->auth_stats();
    return {std::move(l), c};
#else
    static_cast<void>(ucx_tls);
    throw std::runtime_error("sync_node was built without component ucx");
#endif
  }
  auto l = std::make_unique<tcp_transport>(o, r);
  const auth_counters* c = &l->auth_stats();
  return {std::move(l), c};
}

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0); // a line per event, as it happens (the script watches)
  if (argc < 6) return usage();
  const std::string cmd = argv[1];
  tcp_options o{.host = argv[2], .port = static_cast<std::uint16_t>(std::stoul(argv[3]))};
  const std::uint64_t seed = std::stoull(argv[5]);
  double timeout_s = 30;
  std::vector<std::string> to, tamper;
  std::uint64_t first = 1;
  int retries = 1;
  std::chrono::milliseconds retry_pause{200}, version_pause{0};
  std::optional<std::chrono::milliseconds> step_timeout, commit_timeout;
  std::string transport = "tcp", ucx_tls = "tcp";
  std::uint64_t bucket_bytes = 4096;
  bool cut_through = true;
  for (int a = 6; a < argc; ++a) {
    const std::string opt = argv[a];
    const bool more = a + 1 < argc;
    if (opt == "--listen") {
      o.listen = true;
    } else if (opt == "--insecure") {
      o.allow_unauthenticated = true;
    } else if (opt == "--secret-env" && more) {
      o.auth = openssl_authenticator::from_env(argv[++a]);
    } else if (opt == "--tags" && more) {
      const std::string t = argv[++a];
      o.tags = t == "control" ? integrity::control : integrity::full;
    } else if (opt == "--layers" && more) {
      shape.layers = std::stoi(argv[++a]);
    } else if (opt == "--extra-kib" && more) {
      shape.extra_kib = std::stoll(argv[++a]);
    } else if (opt == "--change" && more) {
      shape.change = std::stod(argv[++a]);
    } else if (opt == "--to" && more) {
      to.emplace_back(argv[++a]);
    } else if (opt == "--tamper" && more) {
      tamper.emplace_back(argv[++a]);
      if (tamper.back() != "manifest" && tamper.back() != "piece") return usage();
    } else if (opt == "--timeout-s" && more) {
      timeout_s = std::stod(argv[++a]);
    } else if (opt == "--first" && more) {
      first = std::stoull(argv[++a]);
    } else if (opt == "--retries" && more) {
      retries = std::stoi(argv[++a]);
    } else if (opt == "--retry-pause-ms" && more) {
      retry_pause = std::chrono::milliseconds(std::stoll(argv[++a]));
    } else if (opt == "--version-pause-ms" && more) {
      version_pause = std::chrono::milliseconds(std::stoll(argv[++a]));
    } else if (opt == "--step-timeout-ms" && more) {
      step_timeout = std::chrono::milliseconds(std::stoll(argv[++a]));
    } else if (opt == "--commit-timeout-ms" && more) {
      commit_timeout = std::chrono::milliseconds(std::stoll(argv[++a]));
    } else if (opt == "--dead-peer-ms" && more) {
      o.dead_peer_timeout = std::chrono::milliseconds(std::stoll(argv[++a]));
    } else if (opt == "--socket-buffer-kib" && more) {
      o.socket_buffer = std::stoi(argv[++a]) * 1024;
    } else if (opt == "--bucket-kib" && more) {
      bucket_bytes = std::stoull(argv[++a]) << 10;
    } else if (opt == "--transport" && more) {
      transport = argv[++a];
      if (transport != "tcp" && transport != "ucx") return usage();
    } else if (opt == "--ucx-tls" && more) {
      ucx_tls = argv[++a];
    } else if (opt == "--store-and-forward") {
      cut_through = false;
    } else {
      return usage();
    }
  }
  if (cmd == "relay") {
    try {
      return relay_main(o.host, o.port, argv[4], seed, tamper, timeout_s);
    } catch (const std::exception& e) {
      std::printf("error: %s\n", e.what());
      return 1;
    }
  }
  const std::uint64_t versions = std::stoull(argv[4]);
  const plan_options buckets{.bucket_bytes = bucket_bytes, .alignment = 256};
  sender_options so{.delta = true, .timeout = step_timeout.value_or(10s)};
  if (commit_timeout) so.commit_timeout = *commit_timeout;
  try {
    if (cmd == "send") {
      model md = model_v(seed, first);
      node_link out = open_link(transport, ucx_tls, o, role::sender);
      sender tx(*out.link, plan(md.refs, buckets), md.refs, so);
      std::printf("sending from %.3f\n", wall_now()); // the model is built: timing starts here
      std::uint64_t wire = 0, failures = 0;
      for (std::uint64_t v = first; v <= versions; ++v) {
        if (v > first) {
          std::this_thread::sleep_for(version_pause);
          step_to(md, v);
        }
        for (int attempt = 1;; ++attempt) {
          const auto t0 = std::chrono::steady_clock::now();
          try {
            const publish_result r = tx.publish(v);
            wire += r.wire_bytes;
            std::printf("version %llu: %s%s, %llu payload bytes, attempt %d\n", static_cast<unsigned long long>(v),
                        r.delta ? "delta" : "dense",
                        r.fell_back   ? " (fell back: the receiver refused a delta, sent dense)"
                        : r.confirmed ? " (confirmed: the receiver held it already)"
                                      : "",
                        static_cast<unsigned long long>(r.wire_bytes), attempt);
            break;
          } catch (const rlpt::error& e) {
            ++failures;
            std::printf("version %llu attempt %d failed at %.3f after %.3f s: %.*s: %s\n",
                        static_cast<unsigned long long>(v), attempt, wall_now(),
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                        static_cast<int>(e.id().size()), e.id().data(), e.message().c_str());
            if (attempt >= retries) throw;
            std::this_thread::sleep_for(retry_pause);
          }
        }
      }
      std::printf("sent %llu versions, %llu payload bytes, handshakes %llu, %llu failed attempts\n",
                  static_cast<unsigned long long>(versions - first + 1), static_cast<unsigned long long>(wire),
                  static_cast<unsigned long long>(out.counters->handshakes), static_cast<unsigned long long>(failures));
      return 0;
    }
    if (cmd == "recv" || cmd == "forward") {
      node_link in = open_link(transport, ucx_tls, o, role::receiver);
      std::vector<node_link> outs;
      std::vector<rlpt::sync::link*> down;
      for (const std::string& hp : to) {
        tcp_options d = o;
        d.listen = false;
        const endpoint e = endpoint::parse(hp);
        d.host = e.host;
        d.port = e.port;
        outs.push_back(open_link(transport, ucx_tls, d, role::sender));
        down.push_back(outs.back().link.get());
      }
      forwarder_options fo{.send = so, .cut_through = cut_through};
      if (step_timeout) fo.receive.timeout = *step_timeout;
      forwarder fw(*in.link, down, {}, fo);
      const receiver& rx = fw.upstream();
      const auth_counters& c = *in.counters;
      std::uint64_t forwarded = 0, forward_failures = 0, refused_frames = 0, refused_peers = 0;
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
      std::uint64_t published = 0, failed = 0;
      const auto holding = [&] {
        return rx.has_version() ? fmt::format("holding version {}", rx.version()) : std::string("holding no version");
      };
      while ((!rx.has_version() || rx.version() < versions) && std::chrono::steady_clock::now() < until) {
        const update u = fw.poll(50ms);
        if (c.refused_frames != refused_frames || c.refused_peers != refused_peers) {
          std::printf("refused %s at %.3f (%s): %s\n", c.refused_frames != refused_frames ? "a frame" : "a peer",
                      wall_now(), holding().c_str(), c.last_refusal.c_str());
          refused_frames = c.refused_frames;
          refused_peers = c.refused_peers;
        }
        if (u.failed()) {
          ++failed;
          std::printf("update of version %llu failed at %.3f after %.3f s (%s): %s: %s\n",
                      static_cast<unsigned long long>(u.version), wall_now(), u.seconds, holding().c_str(),
                      u.error_id.c_str(), u.reason.c_str());
        }
        if (!u.published()) continue;
        ++published;
        std::printf("published version %llu (%s), %llu bytes at %.3f\n", static_cast<unsigned long long>(u.version),
                    u.delta ? fmt::format("delta from version {}", u.base_version).c_str() : "dense",
                    static_cast<unsigned long long>(u.bytes), wall_now());
        for (const forward_result& r : fw.last_forwarded()) {
          forwarded += r.sent.wire_bytes;
          if (r.ok)
            std::printf("forwarded version %llu to %s (%s), %llu payload bytes\n",
                        static_cast<unsigned long long>(u.version), to[r.link].c_str(),
                        r.cut_through ? "cut-through"
                                      : fmt::format("store-and-forward{}{}", r.cut_through_failure.empty() ? "" : ": ",
                                                    r.cut_through_failure)
                                            .c_str(),
                        static_cast<unsigned long long>(r.sent.wire_bytes));
          if (!r.ok) {
            ++forward_failures;
            std::printf("forwarding version %llu to %s failed at %.3f: %s %s\n",
                        static_cast<unsigned long long>(u.version), to[r.link].c_str(), wall_now(), r.error_id.c_str(),
                        r.reason.c_str());
          }
        }
        // Every published version is exactly the sender's.
        model want = model_v(seed, u.version);
        for (const auto& t : want.refs)
          if (!same_bytes(rx.tensor(t.name).bytes, want.bytes(t.name))) {
            std::printf("version %llu: tensor %s differs from the sender's\n",
                        static_cast<unsigned long long>(u.version), t.name.c_str());
            return 1;
          }
      }
      std::printf("received version %llu (%llu published, %llu failed), handshakes %llu, refused peers %llu, refused "
                  "frames %llu, last refusal: %s\n",
                  static_cast<unsigned long long>(rx.has_version() ? rx.version() : 0),
                  static_cast<unsigned long long>(published), static_cast<unsigned long long>(failed),
                  static_cast<unsigned long long>(c.handshakes), static_cast<unsigned long long>(c.refused_peers),
                  static_cast<unsigned long long>(c.refused_frames), c.last_refusal.c_str());
      if (!to.empty())
        std::printf("forwarded %llu payload bytes to %zu hosts, %llu failures\n",
                    static_cast<unsigned long long>(forwarded), to.size(),
                    static_cast<unsigned long long>(forward_failures));
      return rx.has_version() && rx.version() == versions && forward_failures == 0 ? 0 : 1;
    }
  } catch (const rlpt::error& e) {
    std::printf("error %.*s: %s\n", static_cast<int>(e.id().size()), e.id().data(), e.message().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
  return usage();
}
