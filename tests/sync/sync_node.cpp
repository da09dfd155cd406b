// SPDX-License-Identifier: Apache-2.0
// One host of the namespaced-cluster test (netns_cluster.sh): a trainer that publishes seeded
// model versions, or an inference host that receives them and checks every published version
// bit-exact. Prints one line; exits 0 when everything it was asked to do happened.
//
//   sync_node send|recv|forward HOST PORT VERSIONS SEED [--listen] [--secret-env VAR] [--insecure]
//                       [--tags full|control] [--timeout-s S] [--layers N] [--to HOST:PORT]...
//
// forward: receives as recv does and passes every version on to each --to host (sync/forward.hpp).
//
// The secret comes from the environment variable named by --secret-env; without one the link
// is unauthenticated, which a non-loopback address refuses unless --insecure opts out.
#include "sync_support.hpp"

#include <rlpt/sync/auth_openssl.hpp>
#include <rlpt/sync/forward.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

namespace {

int layers = 3;

int usage() {
  std::fprintf(stderr, "usage: sync_node send|recv HOST PORT VERSIONS SEED [--listen] [--secret-env VAR] "
                       "[--insecure] [--tags full|control] [--timeout-s S]\n");
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  if (argc < 6) return usage();
  const std::string cmd = argv[1];
  tcp_options o{.host = argv[2], .port = static_cast<std::uint16_t>(std::stoul(argv[3]))};
  const std::uint64_t versions = std::stoull(argv[4]), seed = std::stoull(argv[5]);
  double timeout_s = 30;
  std::vector<std::string> to;
  for (int a = 6; a < argc; ++a) {
    const std::string opt = argv[a];
    if (opt == "--listen") {
      o.listen = true;
    } else if (opt == "--insecure") {
      o.allow_unauthenticated = true;
    } else if (opt == "--secret-env" && a + 1 < argc) {
      o.auth = openssl_authenticator::from_env(argv[++a]);
    } else if (opt == "--tags" && a + 1 < argc) {
      const std::string t = argv[++a];
      o.tags = t == "control" ? integrity::control : integrity::full;
    } else if (opt == "--layers" && a + 1 < argc) {
      layers = std::stoi(argv[++a]);
    } else if (opt == "--to" && a + 1 < argc) {
      to.emplace_back(argv[++a]);
    } else if (opt == "--timeout-s" && a + 1 < argc) {
      timeout_s = std::stod(argv[++a]);
    } else {
      return usage();
    }
  }
  const plan_options buckets{.bucket_bytes = 4096, .alignment = 256};
  try {
    if (cmd == "send") {
      model md = model_at(seed, 1, 2000, layers);
      tcp_transport out(o, role::sender);
      sender tx(out, plan(md.refs, buckets), md.refs, {.delta = true, .timeout = 10s});
      std::uint64_t wire = 0;
      for (std::uint64_t v = 1; v <= versions; ++v) {
        if (v > 1) {
          rlpt::test::rng r(2000 + v);
          md.step(0.02, r);
        }
        wire += tx.publish(v).wire_bytes;
      }
      std::printf("sent %llu versions, %llu payload bytes, handshakes %llu\n",
                  static_cast<unsigned long long>(versions), static_cast<unsigned long long>(wire),
                  static_cast<unsigned long long>(out.auth_stats().handshakes));
      return 0;
    }
    if (cmd == "recv" || cmd == "forward") {
      tcp_transport in(o, role::receiver);
      std::vector<std::unique_ptr<tcp_transport>> outs;
      std::vector<rlpt::sync::link*> down;
      for (const std::string& hp : to) {
        tcp_options d = o;
        d.listen = false;
        d.host = hp.substr(0, hp.rfind(':'));
        d.port = static_cast<std::uint16_t>(std::stoul(hp.substr(hp.rfind(':') + 1)));
        outs.push_back(std::make_unique<tcp_transport>(d, role::sender));
        down.push_back(outs.back().get());
      }
      forwarder fw(in, down, {}, {.send = {.delta = true, .timeout = 10s}});
      const receiver& rx = fw.upstream();
      std::uint64_t forwarded = 0, forward_failures = 0;
      const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
      std::uint64_t published = 0, failed = 0;
      while ((!rx.has_version() || rx.version() < versions) && std::chrono::steady_clock::now() < until) {
        const update u = fw.poll(50ms);
        if (u.failed()) ++failed;
        if (!u.published()) continue;
        ++published;
        for (const forward_result& r : fw.last_forwarded()) {
          forwarded += r.sent.wire_bytes;
          if (!r.ok) {
            ++forward_failures;
            std::printf("forwarding version %llu to %s failed: %s %s\n", static_cast<unsigned long long>(u.version),
                        to[r.link].c_str(), r.error_id.c_str(), r.reason.c_str());
          }
        }
        // Every published version is exactly the sender's.
        model want = model_at(seed, u.version, 2000, layers);
        for (const auto& t : want.refs)
          if (!same_bytes(rx.tensor(t.name).bytes, want.bytes(t.name))) {
            std::printf("version %llu: tensor %s differs from the sender's\n",
                        static_cast<unsigned long long>(u.version), t.name.c_str());
            return 1;
          }
      }
      const auth_counters& c = in.auth_stats();
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
  }
  return usage();
}
