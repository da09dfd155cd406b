// SPDX-License-Identifier: Apache-2.0
// Loader for golden vectors (tools/golden/rlpt_golden.py writes them). Little-endian:
//   "RLPTGLD1", u32 count, then per array: u16 name length, name, u8 dtype code
//   (0 f32, 1 f64, 2 i32, 3 i64, 4 u8), u8 ndim, ndim x u64 dims, raw row-major data.
// The array "meta" (u8) holds UTF-8 JSON describing the generator, seed and peer versions.
#pragma once

#include <rlpt/core/error.hpp>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

namespace rlpt::test {

//! The id of golden-file errors (a test-only id: error_id constants only, no string literals).
inline constexpr error_id golden_error{"rlpt.test.golden"};

struct golden_array {
  std::uint8_t code = 0;
  std::vector<std::uint64_t> shape;
  std::vector<unsigned char> bytes;

  [[nodiscard]] std::size_t numel() const {
    std::size_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }

  //! The data converted to T (any numeric T): golden files store the peer's own dtype.
  template <class T> [[nodiscard]] std::vector<T> as() const {
    std::vector<T> out(numel());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(element(i));
    return out;
  }

private:
  [[nodiscard]] double element(std::size_t i) const {
    switch (code) {
    case 0:
      return load<float>(i);
    case 1:
      return load<double>(i);
    case 2:
      return load<std::int32_t>(i);
    case 3:
      return static_cast<double>(load<std::int64_t>(i));
    case 4:
      return load<std::uint8_t>(i);
    default:
      return 0.0;
    }
  }
  template <class U> [[nodiscard]] double load(std::size_t i) const {
    U u;
    std::memcpy(&u, bytes.data() + i * sizeof(U), sizeof(U));
    return static_cast<double>(u);
  }
};

class golden_file {
public:
  explicit golden_file(const std::string& path) : path_(path) {
    std::ifstream in(path, std::ios::binary);
    RLPT_CHECK(in.good(), golden_error, "cannot open golden file {}", path);
    const std::vector<unsigned char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::size_t pos = 0;
    auto need = [&](std::size_t n) {
      RLPT_CHECK(pos + n <= data.size(), golden_error, "{} is truncated at byte {}", path, pos);
    };
    auto read = [&](auto& v) {
      need(sizeof(v));
      std::memcpy(&v, data.data() + pos, sizeof(v));
      pos += sizeof(v);
    };
    need(8);
    RLPT_CHECK(std::memcmp(data.data(), "RLPTGLD1", 8) == 0, golden_error, "{} is not a golden file", path);
    pos = 8;
    std::uint32_t count = 0;
    read(count);
    for (std::uint32_t k = 0; k < count; ++k) {
      std::uint16_t name_len = 0;
      read(name_len);
      need(name_len);
      std::string name(reinterpret_cast<const char*>(data.data() + pos), name_len);
      pos += name_len;
      golden_array a;
      std::uint8_t ndim = 0;
      read(a.code);
      read(ndim);
      RLPT_CHECK(a.code <= 4, golden_error, "{}: array {} has unknown dtype code {}", path, name, a.code);
      a.shape.resize(ndim);
      for (auto& d : a.shape) read(d);
      static constexpr std::size_t sizes[] = {4, 8, 4, 8, 1};
      const std::size_t nbytes = a.numel() * sizes[a.code];
      need(nbytes);
      a.bytes.assign(data.begin() + static_cast<std::ptrdiff_t>(pos),
                     data.begin() + static_cast<std::ptrdiff_t>(pos + nbytes));
      pos += nbytes;
      arrays_.emplace(std::move(name), std::move(a));
    }
  }

  [[nodiscard]] bool has(const std::string& name) const { return arrays_.count(name) != 0; }
  [[nodiscard]] const golden_array& operator[](const std::string& name) const {
    auto it = arrays_.find(name);
    RLPT_CHECK(it != arrays_.end(), golden_error, "{} has no array named {}", path_, name);
    return it->second;
  }
  template <class T> [[nodiscard]] std::vector<T> get(const std::string& name) const { return (*this)[name].as<T>(); }
  [[nodiscard]] std::string meta() const {
    if (!has("meta")) return {};
    const auto& b = (*this)["meta"].bytes;
    return {b.begin(), b.end()};
  }

private:
  std::string path_;
  std::map<std::string, golden_array> arrays_;
};

//! Path of a committed golden file: tests/data/golden/<family>/<name>.
inline std::string golden_path(const std::string& family, const std::string& name) {
  return std::string(RLPT_TEST_DATA_DIR) + "/golden/" + family + "/" + name;
}

} // namespace rlpt::test
