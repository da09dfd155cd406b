// UCX from an installed rlpt (component ucx): a message crosses a loopback UCX link.
#include <rlpt/sync/ucx.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

int main() {
  using namespace rlpt::sync;
  ucx_transport rx({.listen = true}, role::receiver);
  bool sent = false;
  std::thread tx_thread([&] {
    ucx_transport tx({.port = rx.port()}, role::sender);
    const std::string text = "weights";
    auto buf = tx.payload_buffer(text.size(), after(std::chrono::seconds(10)));
    std::memcpy(buf.data(), text.data(), text.size());
    tx.send({}, text.size(), after(std::chrono::seconds(10)));
    sent = true;
    // Stay connected until the receiver has it (closing flushes, but a test should not race).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  });
  const auto m = rx.receive(after(std::chrono::seconds(10)));
  const bool got = m && std::string(reinterpret_cast<const char*>(m->payload.data()), m->payload.size()) == "weights";
  tx_thread.join();
  std::printf("sent %s, received %s over %s\n", sent ? "yes" : "no", got ? "yes" : "no", rx.info().name.c_str());
  return sent && got ? 0 : 1;
}
