// SPDX-License-Identifier: Apache-2.0
//! @file
//! The authenticator of cross-machine links over OpenSSL's libcrypto (3.0 or newer): handshake
//! MACs are HMAC-SHA-256 under the job secret, frame tags AES-256-GMAC under the session key,
//! nonces come from RAND_bytes. Needs the CMake component `auth` (rlpt::auth, which links
//! OpenSSL::Crypto); no other rlpt header includes this one.
//!
//!     auto auth = rlpt::sync::openssl_authenticator::from_env("RLPT_SYNC_SECRET");
//!     rlpt::sync::tcp_transport link({.host = "10.0.0.2", .port = 5555, .auth = auth}, role::sender);
#pragma once

#include <rlpt/config.hpp>
#include <rlpt/core/error.hpp>
#include <rlpt/sync/auth.hpp>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/opensslv.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

static_assert(OPENSSL_VERSION_MAJOR >= 3, "rlpt/sync/auth_openssl.hpp needs OpenSSL 3.0 or newer");

RLPT_NAMESPACE_BEGIN
namespace sync {

class openssl_authenticator final : public authenticator {
public:
  //! Shortest secret accepted: 128 bits.
  static constexpr std::size_t min_secret_bytes = 16;

  //! An authenticator keyed by the job's `secret` (copied; wiped on destruction).
  explicit openssl_authenticator(std::span<const std::byte> secret) : secret_(secret.begin(), secret.end()) {
    RLPT_CHECK(secret.size() >= min_secret_bytes, errors::sync::bad_link,
               "auth: the secret has {} bytes; at least {} are required (use 32 random bytes, e.g. `openssl rand -hex "
               "32`)",
               secret.size(), min_secret_bytes);
    hmac_ = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    RLPT_CHECK(hmac_ != nullptr, errors::sync::auth, "auth: OpenSSL has no HMAC: {}", last_error());
  }

  //! The secret held in environment variable `var` (its bytes as given; hex is fine).
  [[nodiscard]] static std::shared_ptr<const openssl_authenticator> from_env(const char* var) {
    const char* v = std::getenv(var);
    RLPT_CHECK(v != nullptr, errors::sync::bad_link, "auth: environment variable {} (the job's secret) is not set",
               var);
    const std::string_view s(v);
    return std::make_shared<const openssl_authenticator>(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
  }

  //! The secret given as a string (its bytes as given).
  [[nodiscard]] static std::shared_ptr<const openssl_authenticator> from_string(std::string_view s) {
    return std::make_shared<const openssl_authenticator>(
        std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size()));
  }

  openssl_authenticator(const openssl_authenticator&) = delete;
  openssl_authenticator& operator=(const openssl_authenticator&) = delete;
  ~openssl_authenticator() override {
    OPENSSL_cleanse(secret_.data(), secret_.size());
    EVP_MAC_free(hmac_);
  }

  void random(std::span<std::byte> out) const override {
    RLPT_CHECK(RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(out.size())) == 1,
               errors::sync::auth, "auth: RAND_bytes failed: {}", last_error());
  }

  [[nodiscard]] mac secret_mac(byte_parts parts) const override {
    std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(EVP_MAC_CTX_new(hmac_), &EVP_MAC_CTX_free);
    char digest[] = "SHA256";
    const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                                 OSSL_PARAM_construct_end()};
    bool ok = ctx != nullptr && EVP_MAC_init(ctx.get(), reinterpret_cast<const unsigned char*>(secret_.data()),
                                             secret_.size(), params) == 1;
    for (const auto& p : parts)
      ok = ok && EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(p.data()), p.size()) == 1;
    mac out{};
    std::size_t len = 0;
    ok = ok && EVP_MAC_final(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &len, out.size()) == 1 &&
         len == out.size();
    RLPT_CHECK(ok, errors::sync::auth, "auth: HMAC-SHA-256 failed: {}", last_error());
    return out;
  }

  [[nodiscard]] tag frame_tag(const mac& key, std::uint64_t nonce, byte_parts parts) const override {
    std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)> ctx(EVP_CIPHER_CTX_new(), &EVP_CIPHER_CTX_free);
    unsigned char iv[12] = {};
    std::memcpy(iv + 4, &nonce, 8);
    int len = 0;
    bool ok =
        ctx != nullptr && EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
        EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, reinterpret_cast<const unsigned char*>(key.data()), iv) == 1;
    // GMAC: everything is additional authenticated data; OpenSSL takes it in int-sized pieces.
    for (const auto& p : parts)
      for (std::size_t at = 0; ok && at < p.size();) {
        const std::size_t n = std::min<std::size_t>(p.size() - at, std::size_t{1} << 30);
        ok = EVP_EncryptUpdate(ctx.get(), nullptr, &len, reinterpret_cast<const unsigned char*>(p.data() + at),
                               static_cast<int>(n)) == 1;
        at += n;
      }
    unsigned char none[16];
    tag out{};
    ok = ok && EVP_EncryptFinal_ex(ctx.get(), none, &len) == 1 &&
         EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(out.size()), out.data()) == 1;
    RLPT_CHECK(ok, errors::sync::auth, "auth: AES-256-GMAC failed: {}", last_error());
    return out;
  }

  [[nodiscard]] std::string describe() const override {
    return rlpt::detail::format("HMAC-SHA-256 handshake, AES-256-GMAC frame tags ({})",
                                OpenSSL_version(OPENSSL_VERSION));
  }

private:
  static std::string last_error() {
    char buf[256] = "no OpenSSL error queued";
    if (const unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, buf, sizeof(buf));
    return buf;
  }

  std::vector<std::byte> secret_;
  EVP_MAC* hmac_ = nullptr;
};

} // namespace sync
RLPT_NAMESPACE_END
