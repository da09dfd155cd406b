// SPDX-License-Identifier: Apache-2.0
//! @file
//! IPv4 addresses for the socket-addressed links (tcp_transport, ucx_transport): resolving a
//! host, telling loopback apart and the rule for unauthenticated links, written once.
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/auth.hpp>
#include <rlpt/sync/link.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

RLPT_NAMESPACE_BEGIN
namespace sync::detail {

//! Loopback without asking a resolver: 127.0.0.0/8 literals and "localhost".
[[nodiscard]] inline bool is_loopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

//! `host` (an IPv4 literal or a name) and `port`; `id` and `link` name a failure to resolve.
RLPT_DEFER [[nodiscard]] sockaddr_in ipv4_address(const std::string& host, std::uint16_t port, error_id id,
                                                  std::string_view link);

//! The rule of every cross-machine link: a non-loopback address needs an authenticator unless
//! the user opted out, and the frame tags are one of the two integrity modes.
RLPT_DEFER void check_link_security(std::string_view link, const std::string& host, std::uint16_t port, bool listen,
                                    const authenticator* auth, integrity tags, bool allow_unauthenticated, role r);

} // namespace sync::detail
RLPT_NAMESPACE_END

#if RLPT_HEADER_IMPL()
RLPT_NAMESPACE_BEGIN
namespace sync::detail {

RLPT_DEFER RLPT_INLINE sockaddr_in ipv4_address(const std::string& host, std::uint16_t port, error_id id,
                                                std::string_view link) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) == 1) return a;
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  RLPT_CHECK(rc == 0 && res != nullptr, id, "{}: cannot resolve host \"{}\": {}", link, host, ::gai_strerror(rc));
  a.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  ::freeaddrinfo(res);
  return a;
}

RLPT_DEFER RLPT_INLINE void check_link_security(std::string_view link, const std::string& host, std::uint16_t port,
                                                bool listen, const authenticator* auth, integrity tags,
                                                bool allow_unauthenticated, role r) {
  RLPT_CHECK(auth != nullptr || allow_unauthenticated || is_loopback(host), errors::sync::insecure,
             "{} {}:{}: {} a non-loopback address without authentication lets any host that reaches it {} weights; "
             "set {}_options::auth (rlpt/sync/auth_openssl.hpp, a per-job secret) or, on a network where every host "
             "is trusted, allow_unauthenticated = true",
             link, host, port, listen ? "listening on" : "connecting to", r == role::receiver ? "publish" : "receive",
             link);
  RLPT_CHECK(auth == nullptr || tags == integrity::control || tags == integrity::full, errors::sync::bad_link,
             "{} {}:{}: {}_options::tags is {}, not integrity::control or integrity::full", link, host, port, link,
             static_cast<unsigned>(tags));
}

} // namespace sync::detail
RLPT_NAMESPACE_END
#endif // RLPT_HEADER_IMPL()
