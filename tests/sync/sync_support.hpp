// SPDX-License-Identifier: Apache-2.0
// Helpers shared by the sync tests: seeded models, a byte mutator for fuzzing, a link wrapper
// that injects faults, and process-resource counters (open fds, /dev/shm entries).
#pragma once

#include "support/errors.hpp"
#include "support/random.hpp"

#include <rlpt/sync.hpp>

#include <doctest/doctest.h>

#include <dirent.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace rlpt::test::sync {

using namespace rlpt::sync;

//! Owned tensors plus the tensor_refs pointing at them.
struct model {
  std::vector<std::vector<std::byte>> storage;
  std::vector<tensor_ref> refs;

  void add(std::string name, wire_dtype dt, std::vector<std::int64_t> shape, rng& r) {
    std::uint64_t n = size_of(dt);
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    std::vector<std::byte> bytes(static_cast<std::size_t>(n));
    fill(bytes, dt, r);
    storage.push_back(std::move(bytes));
    refs.push_back({std::move(name), dt, std::move(shape), nullptr});
    for (std::size_t i = 0; i < refs.size(); ++i) refs[i].data = storage[i].data();
  }

  static void fill(std::vector<std::byte>& bytes, wire_dtype dt, rng& r) {
    const std::size_t eb = size_of(dt);
    for (std::size_t i = 0; i + eb <= bytes.size(); i += eb) {
      const double v = r.normal(0.0, 0.05);
      switch (dt) {
      case wire_dtype::bf16: {
        const auto b = rlpt::bf16(static_cast<float>(v)).bits;
        std::memcpy(&bytes[i], &b, 2);
        break;
      }
      case wire_dtype::f16: {
        const auto b = rlpt::f16(static_cast<float>(v)).bits;
        std::memcpy(&bytes[i], &b, 2);
        break;
      }
      case wire_dtype::f32: {
        const auto f = static_cast<float>(v);
        std::memcpy(&bytes[i], &f, 4);
        break;
      }
      case wire_dtype::f64:
        std::memcpy(&bytes[i], &v, 8);
        break;
      default:
        for (std::size_t k = 0; k < eb; ++k) bytes[i + k] = static_cast<std::byte>(r.integer(0, 255));
      }
    }
  }

  std::span<std::byte> bytes(std::string_view name) {
    for (std::size_t i = 0; i < refs.size(); ++i)
      if (refs[i].name == name) return storage[i];
    FAIL("no tensor ", std::string(name));
    return {};
  }

  //! Perturbs about `fraction` of the elements of every floating tensor (a training step).
  void step(double fraction, rng& r) {
    for (std::size_t t = 0; t < refs.size(); ++t) {
      const std::size_t eb = size_of(refs[t].dtype);
      auto& b = storage[t];
      for (std::size_t i = 0; i + eb <= b.size(); i += eb)
        if (r.bernoulli(fraction)) b[i] ^= std::byte{1}; // flip the lowest mantissa bit
    }
  }
};

//! A model of mixed dtypes and sizes (some larger than a small bucket).
inline model make_model(std::uint64_t seed, int layers = 3) {
  rng r(seed);
  model m;
  for (int l = 0; l < layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    m.add(p + "self_attn.q_proj.weight", wire_dtype::bf16, {32, 16}, r);
    m.add(p + "self_attn.k_proj.weight", wire_dtype::bf16, {16, 16}, r);
    m.add(p + "self_attn.v_proj.weight", wire_dtype::bf16, {16, 16}, r);
    m.add(p + "mlp.gate_proj.weight", wire_dtype::bf16, {48, 16}, r);
    m.add(p + "mlp.up_proj.weight", wire_dtype::bf16, {48, 16}, r);
    m.add(p + "input_layernorm.weight", wire_dtype::f32, {16}, r);
  }
  m.add("model.embed_tokens.weight", wire_dtype::bf16, {100, 16}, r); // 3200 bytes: split by 1 KiB buckets
  m.add("lm_head.bias", wire_dtype::f32, {0}, r);                     // empty tensor
  return m;
}

//! The model at version v: make_model(seed, layers), then one step per version after the first
//! (step k draws from rng stream + k).
inline model model_at(std::uint64_t seed, std::uint64_t v, std::uint64_t stream = 2000, int layers = 3) {
  model md = make_model(seed, layers);
  for (std::uint64_t k = 2; k <= v; ++k) {
    rng r(stream + k);
    md.step(0.02, r);
  }
  return md;
}

//! Polls until `n` updates were reported (or the limit passes).
inline std::vector<update> poll_n(receiver& rx, std::size_t n,
                                  std::chrono::milliseconds limit = std::chrono::seconds(20)) {
  std::vector<update> out;
  const auto until = clock::now() + limit;
  while (out.size() < n && clock::now() < until) {
    update u = rx.poll(std::chrono::milliseconds(50));
    if (u.state != update::status::idle) out.push_back(std::move(u));
  }
  return out;
}

//! Copies the tensors a receiver loads.
struct sink {
  std::map<std::string, std::vector<std::byte>> got;
  std::map<std::string, wire_dtype> dtype;
  std::map<std::string, std::vector<std::int64_t>> shape;
  int calls = 0;
  load_fn fn() {
    return [this](const tensor_view& t) {
      ++calls;
      got[std::string(t.name)].assign(t.bytes.begin(), t.bytes.end());
      dtype[std::string(t.name)] = t.dtype;
      shape[std::string(t.name)] = {t.shape.begin(), t.shape.end()};
    };
  }
};

inline bool same_bytes(std::span<const std::byte> a, std::span<const std::byte> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

//! Applies 1-4 random mutations (bit flips, byte sets, inserts, deletes, truncation, splices).
inline std::vector<std::byte> mutate(std::vector<std::byte> v, rng& r) {
  static constexpr unsigned char interesting[] = {0x00, 0xff, 0x7f, 0x80, '{', '}', '[',  ']', '"',
                                                  ',',  ':',  '0',  '9',  '-', 'e', '\\', ' ', 0x01};
  const int n = static_cast<int>(r.integer(1, 4));
  for (int k = 0; k < n; ++k) {
    const auto pos = [&] {
      return v.empty() ? std::size_t{0}
                       : static_cast<std::size_t>(r.integer(0, static_cast<std::int64_t>(v.size()) - 1));
    };
    switch (r.integer(0, 6)) {
    case 0:
      if (!v.empty()) v[pos()] ^= static_cast<std::byte>(1u << r.integer(0, 7));
      break;
    case 1:
      if (!v.empty()) v[pos()] = static_cast<std::byte>(r.integer(0, 255));
      break;
    case 2:
      if (!v.empty()) v[pos()] = static_cast<std::byte>(interesting[r.integer(0, sizeof(interesting) - 1)]);
      break;
    case 3: {
      const std::size_t at = v.empty() ? 0 : pos();
      const auto len = static_cast<std::size_t>(r.integer(1, 8));
      std::vector<std::byte> ins(len);
      for (auto& b : ins) b = static_cast<std::byte>(interesting[r.integer(0, sizeof(interesting) - 1)]);
      v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), ins.begin(), ins.end());
      break;
    }
    case 4:
      if (!v.empty()) {
        const std::size_t at = pos();
        const std::size_t len = std::min<std::size_t>(v.size() - at, static_cast<std::size_t>(r.integer(1, 16)));
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(at), v.begin() + static_cast<std::ptrdiff_t>(at + len));
      }
      break;
    case 5:
      if (!v.empty()) v.resize(pos());
      break;
    default:
      if (v.size() > 2) { // copy a range over another (splices structure)
        const std::size_t a = pos(), b = pos();
        const std::size_t len = std::min({v.size() - a, v.size() - b, static_cast<std::size_t>(r.integer(1, 32))});
        std::memmove(v.data() + b, v.data() + a, len);
      }
    }
  }
  return v;
}

//! Runs `parse` on `iterations` mutants of `seed_bytes`: every outcome must be success or an
//! rlpt::error with an rlpt.* id and a message; anything else (another exception type) fails.
template <class Parse>
std::size_t fuzz(const std::vector<std::byte>& seed_bytes, int iterations, std::uint64_t stream, Parse&& parse) {
  rng r(stream);
  std::size_t rejected = 0;
  for (int it = 0; it < iterations; ++it) {
    const std::vector<std::byte> input = mutate(seed_bytes, r);
    try {
      parse(input);
    } catch (const rlpt::error& e) {
      ++rejected;
      if (e.id().rfind("rlpt.", 0) != 0 || e.message().empty()) FAIL_CHECK("bad error id or message: ", e.what());
    } catch (const std::exception& e) {
      FAIL_CHECK("iteration ", it, " threw a non-rlpt exception: ", e.what());
    }
  }
  return rejected;
}

inline std::vector<std::byte> to_bytes(std::string_view s) {
  return {reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size()};
}

//! Number of open file descriptors of this process.
inline int open_fds() {
  int n = 0;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (::readdir(d)) ++n;
    ::closedir(d);
  }
  return n - 3; // ".", ".." and the directory's own fd
}

//! Names in /dev/shm starting with `prefix`.
inline std::set<std::string> shm_entries(const std::string& prefix) {
  std::set<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (const dirent* e = ::readdir(d))
      if (std::string_view(e->d_name).rfind(prefix, 0) == 0) out.insert(e->d_name);
    ::closedir(d);
  }
  return out;
}

//! A unique name per test process.
inline std::string unique_name(std::string_view tag) { return fmt::format("rlpt-test-{}-{}", tag, ::getpid()); }

//! Wraps a link and lets a test corrupt, drop or stall what the sender sends.
class faulty_link final : public link {
public:
  explicit faulty_link(link& inner) : inner_(inner) {}
  //! Called with (message index, meta, payload) before each send; may modify or return false to drop.
  std::function<bool(std::size_t, std::vector<std::byte>&, std::span<std::byte>)> on_send;

  [[nodiscard]] link_info info() const override { return inner_.info(); }
  std::span<std::byte> payload_buffer(std::uint64_t bytes, deadline until) override {
    last_payload_ = inner_.payload_buffer(bytes, until);
    return last_payload_;
  }
  void send(std::span<const std::byte> meta, std::uint64_t payload_bytes, deadline until) override {
    std::vector<std::byte> m(meta.begin(), meta.end());
    const std::span<std::byte> p =
        payload_bytes ? last_payload_.first(static_cast<std::size_t>(payload_bytes)) : std::span<std::byte>{};
    const std::size_t index = sent_++;
    if (on_send && !on_send(index, m, p)) return;
    inner_.send(m, payload_bytes, until);
  }
  std::optional<message> receive(deadline until) override { return inner_.receive(until); }
  void release() override { inner_.release(); }

private:
  link& inner_;
  std::span<std::byte> last_payload_;
  std::size_t sent_ = 0;
};

//! Frame type of an encoded meta block.
inline frame_type type_of(std::span<const std::byte> meta) {
  std::uint16_t t;
  std::memcpy(&t, meta.data() + 6, 2);
  return static_cast<frame_type>(t);
}

} // namespace rlpt::test::sync
