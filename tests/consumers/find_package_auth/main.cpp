// Authenticated TCP from an installed rlpt (component auth): a message crosses a loopback link
// whose ends share the job's secret; an end with another secret is refused.
#include <rlpt/sync/auth_openssl.hpp>
#include <rlpt/sync/tcp.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

int main() {
  using namespace rlpt::sync;
  const auto secret = openssl_authenticator::from_string("consumer test secret, 32 bytes!!");
  tcp_transport rx({.listen = true, .auth = secret}, role::receiver);
  std::string sent_ok = "no";
  std::thread tx_thread([&] {
    tcp_transport tx({.port = rx.port(), .auth = secret}, role::sender);
    const std::string text = "weights";
    auto buf = tx.payload_buffer(text.size(), after(std::chrono::seconds(10)));
    std::memcpy(buf.data(), text.data(), text.size());
    tx.send({}, text.size(), after(std::chrono::seconds(10)));
    sent_ok = "yes";
  });
  const auto m = rx.receive(after(std::chrono::seconds(10)));
  tx_thread.join();
  const bool got = m && std::string(reinterpret_cast<const char*>(m->payload.data()), m->payload.size()) == "weights";
  bool refused = false;
  try {
    tcp_transport intruder(
        {.port = rx.port(), .auth = openssl_authenticator::from_string("not the job's secret, 32 b")}, role::sender);
    std::thread serve([&] { // the first sender's closed connection is reported first (peer_lost)
      const auto until = after(std::chrono::seconds(3));
      while (clock::now() < until) try {
          static_cast<void>(rx.receive(until));
        } catch (const rlpt::error&) {}
    });
    try {
      intruder.send({}, 0, after(std::chrono::seconds(3)));
    } catch (const rlpt::error& e) {
      refused = std::string(e.id()) == "rlpt.sync.auth";
    }
    serve.join();
  } catch (const rlpt::error& e) {
    std::printf("unexpected: %s\n", e.what());
  }
  std::printf("sent %s, received %s, intruder refused %s (%s)\n", sent_ok.c_str(), got ? "yes" : "no",
              refused ? "yes" : "no", secret->describe().c_str());
  return got && refused && rx.auth_stats().handshakes == 1 ? 0 : 1;
}
