// SPDX-License-Identifier: Apache-2.0
// safetensors: files written by Hugging Face's own `safetensors` package (golden) are read
// exactly and rewritten byte-for-byte; files rlpt writes were read back by the Python package
// (golden check, committed); malformed headers are rejected as Python rejects them; fuzzing;
// the file transport (atomic publish, delta files, corrupted files).
#include "golden_writer.hpp"
#include "receiver_loop.hpp"
#include "support/golden.hpp"

#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>

using namespace rlpt::sync;
using namespace rlpt::test::sync;
using namespace std::chrono_literals;

namespace {

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  const std::vector<char> c((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(c.size());
  if (!c.empty()) std::memcpy(out.data(), c.data(), c.size());
  return out;
}

std::string bytes_string(const rlpt::test::golden_array& a) {
  return {reinterpret_cast<const char*>(a.bytes.data()), a.bytes.size()};
}

// A fresh temporary directory, removed with its files at scope exit.
struct temp_dir {
  std::string path;
  temp_dir() {
    char tmpl[] = "/tmp/rlpt-sync-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~temp_dir() { static_cast<void>(std::system(fmt::format("rm -rf '{}'", path).c_str())); }
  [[nodiscard]] std::vector<std::string> files() const {
    std::vector<std::string> out;
    if (DIR* d = ::opendir(path.c_str())) {
      while (const dirent* e = ::readdir(d))
        if (e->d_name[0] != '.') out.emplace_back(e->d_name);
      ::closedir(d);
    }
    std::sort(out.begin(), out.end());
    return out;
  }
};

double decode(wire_dtype dt, const std::byte* p) {
  switch (dt) {
  case wire_dtype::bf16: {
    std::uint16_t b;
    std::memcpy(&b, p, 2);
    return static_cast<float>(rlpt::bf16::from_bits(b));
  }
  case wire_dtype::f16: {
    std::uint16_t b;
    std::memcpy(&b, p, 2);
    return static_cast<float>(rlpt::f16::from_bits(b));
  }
  case wire_dtype::f32: {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  case wire_dtype::f64: {
    double d;
    std::memcpy(&d, p, 8);
    return d;
  }
  case wire_dtype::i64: {
    std::int64_t v;
    std::memcpy(&v, p, 8);
    return static_cast<double>(v);
  }
  case wire_dtype::i32: {
    std::int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  case wire_dtype::i16: {
    std::int16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  case wire_dtype::i8: {
    std::int8_t v;
    std::memcpy(&v, p, 1);
    return v;
  }
  case wire_dtype::u8:
  case wire_dtype::boolean:
    return static_cast<double>(std::to_integer<unsigned>(*p));
  default:
    return std::nan("");
  }
}

} // namespace

TEST_CASE("safetensors: files from Hugging Face's writer are read exactly (golden)") {
  const rlpt::test::golden_file g(rlpt::test::golden_path("sync", "py_cases.bin"));
  for (const std::string c : {"every_dtype", "awkward_names", "model"}) {
    CAPTURE(c);
    const safetensors_file f(rlpt::test::golden_path("sync", "py_" + c + ".safetensors"));
    const auto& h = f.header();
    std::size_t k = 0;
    for (; g.has(fmt::format("{}.{}.name", c, k)); ++k) {
      const std::string name = bytes_string(g[fmt::format("{}.{}.name", c, k)]);
      CAPTURE(name);
      const safetensors_entry* e = h.find(name);
      REQUIRE(e != nullptr);
      const tensor_view t = f.view(*e);
      const auto shape = g.get<std::int64_t>(fmt::format("{}.{}.shape", c, k));
      CHECK(std::vector<std::int64_t>(t.shape.begin(), t.shape.end()) == shape);
      const auto& bytes = g[fmt::format("{}.{}.bytes", c, k)].bytes;
      CHECK(same_bytes(t.bytes,
                       std::span<const std::byte>(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size())));
      const auto values = g.get<double>(fmt::format("{}.{}.values", c, k));
      const std::size_t eb = size_of(t.dtype);
      REQUIRE(values.size() * eb == t.bytes.size());
      if (t.dtype != wire_dtype::f8_e4m3 && t.dtype != wire_dtype::f8_e5m2)
        for (std::size_t i = 0; i < values.size(); ++i) CHECK(decode(t.dtype, t.bytes.data() + i * eb) == values[i]);
    }
    CHECK(k == h.tensors.size());
  }
  const safetensors_file f(rlpt::test::golden_path("sync", "py_every_dtype.safetensors"));
  CHECK(f.header().meta("format") == std::optional<std::string_view>("pt"));
  CHECK(f.tensor("q.f8e4m3").dtype == wire_dtype::f8_e4m3);
  CHECK(f.tensor("m.bool").dtype == wire_dtype::boolean);
}

TEST_CASE("safetensors: read copies a tensor into the caller's buffer, which must be its size") {
  const safetensors_file f(rlpt::test::golden_path("sync", "py_every_dtype.safetensors"));
  for (const auto& e : f.header().tensors) {
    CAPTURE(e.name);
    const tensor_view t = f.view(e);
    std::vector<std::byte> by_entry(t.bytes.size(), std::byte{0x5A}), by_name(t.bytes.size(), std::byte{0x5A});
    f.read(e, by_entry);
    f.read(e.name, by_name);
    CHECK(std::equal(by_entry.begin(), by_entry.end(), t.bytes.begin(), t.bytes.end()));
    CHECK(by_name == by_entry);
  }
  const safetensors_entry& first = f.header().tensors.front();
  std::vector<std::byte> wrong(static_cast<std::size_t>(first.end - first.begin) + 1);
  RLPT_CHECK_ERROR(f.read(first, wrong), "rlpt.sync.bad_shape", "the destination holds");
  RLPT_CHECK_ERROR(f.read("no.such.tensor", wrong), "rlpt.sync.unknown_tensor", "no.such.tensor");
}

TEST_CASE("safetensors: rlpt's writer reproduces Hugging Face's files byte for byte") {
  for (const std::string c : {"every_dtype", "awkward_names", "model"}) {
    CAPTURE(c);
    const std::string path = rlpt::test::golden_path("sync", "py_" + c + ".safetensors");
    const safetensors_file f(path);
    std::vector<tensor_ref> refs;
    for (const auto& e : f.header().tensors) {
      const tensor_view t = f.view(e);
      refs.push_back({e.name, e.dtype, e.shape, t.bytes.data()});
    }
    std::reverse(refs.begin(), refs.end()); // input order does not matter: HF sorts
    const auto mine = serialize_safetensors(refs, f.header().metadata);
    CHECK(mine == read_file(path));
  }
}

TEST_CASE("safetensors: files rlpt writes were read back by Python's safetensors (golden check)") {
  const std::string golden = rlpt::test::golden_path("sync", "py_reads_rlpt.bin");
  struct stat st {};
  REQUIRE_MESSAGE(::stat(golden.c_str(), &st) == 0, "run tools/golden/gen.py sync with the bench runner built");
  const rlpt::test::golden_file g(golden);
  temp_dir dir;
  const auto names = write_golden_files(dir.path, 0);
  const std::string meta = g.meta();
  for (std::size_t k = 0; k < names.size(); ++k) {
    CAPTURE(names[k]);
    // The bytes Python read are the bytes rlpt writes today...
    const auto& checked = g[fmt::format("file{}.bytes", k)].bytes;
    const auto now = read_file(dir.path + "/" + names[k]);
    CHECK(same_bytes(now,
                     std::span<const std::byte>(reinterpret_cast<const std::byte*>(checked.data()), checked.size())));
    // ...and Python found every tensor with the right bytes.
    CHECK(meta.find(fmt::format("\"{}\": {{\"index\": {}", names[k], k)) != std::string::npos); // json.dumps spacing
    const safetensors_file f(dir.path + "/" + names[k]);
    for (const auto& e : f.header().tensors) {
      const std::string key = fmt::format("file{}.{}.bytes", k, e.name);
      REQUIRE(g.has(key));
      const auto& py = g[key].bytes;
      CHECK(same_bytes(f.view(e).bytes,
                       std::span<const std::byte>(reinterpret_cast<const std::byte*>(py.data()), py.size())));
    }
  }
}

TEST_CASE("safetensors: malformed files are rejected where Python's safetensors rejects them (golden)") {
  const rlpt::test::golden_file g(rlpt::test::golden_path("sync", "py_malformed.bin"));
  int rejected_both = 0;
  for (std::size_t k = 0; g.has(fmt::format("case{}.bytes", k)); ++k) {
    CAPTURE(k);
    const auto& raw = g[fmt::format("case{}.bytes", k)].bytes;
    const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(raw.data()), raw.size());
    const bool python_ok = g[fmt::format("case{}.python_accepts", k)].bytes[0] != 0;
    bool rlpt_ok = true;
    std::string why;
    try {
      static_cast<void>(parse_safetensors_header(bytes, bytes.size(), "case"));
    } catch (const rlpt::error& e) {
      rlpt_ok = false;
      why = e.what();
      CHECK((e.id() == "rlpt.sync.bad_safetensors" || e.id() == "rlpt.sync.json"));
    }
    CAPTURE(why);
    if (!python_ok) {
      CHECK_FALSE(rlpt_ok);
      ++rejected_both;
    } else if (!rlpt_ok) {
      CHECK(why.find("duplicate key") != std::string::npos); // rlpt is stricter only here, on purpose
    }
  }
  CHECK(rejected_both >= 15);
}

TEST_CASE("safetensors: error messages name the problem") {
  auto file = [](std::string header, std::size_t data) {
    header.append((8 - header.size() % 8) % 8, ' ');
    std::vector<std::byte> out(8 + header.size() + data);
    const std::uint64_t n = header.size();
    std::memcpy(out.data(), &n, 8);
    std::memcpy(out.data() + 8, header.data(), header.size());
    return out;
  };
  auto parse = [](const std::vector<std::byte>& f) { return parse_safetensors_header(f, f.size(), "x.safetensors"); };
  RLPT_CHECK_ERROR(parse(file(R"({"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1)),
                   "rlpt.sync.bad_safetensors", "x.safetensors: tensor \"a\" has unsupported dtype F4");
  RLPT_CHECK_ERROR(parse(file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)),
                   "rlpt.sync.bad_safetensors", "tensor \"a\" spans 8 bytes but F32 [3] needs 12");
  RLPT_CHECK_ERROR(parse(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12)),
                   "rlpt.sync.bad_safetensors", "tensor \"a\" starts at 4 but the previous data ends at 0");
  RLPT_CHECK_ERROR(parse(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 9)),
                   "rlpt.sync.bad_safetensors", "the tensors cover 8 data bytes but the file has 9");
  RLPT_CHECK_ERROR(parse(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1}})", 8)),
                   "rlpt.sync.bad_safetensors", "unknown key \"extra\"");
  RLPT_CHECK_ERROR(parse(file(R"({"__metadata__":{"k":1}})", 0)), "rlpt.sync.bad_safetensors",
                   "__metadata__ value of \"k\" is not a string");
  RLPT_CHECK_ERROR(parse(file(R"(x{})", 0)), "rlpt.sync.bad_safetensors", "does not start with '{'");
  RLPT_CHECK_ERROR(parse(file(" \n  ", 0)), "rlpt.sync.bad_safetensors", "does not start with '{'");
  // Leading JSON whitespace is accepted, as safetensors' own reader (0.8.0) accepts it.
  CHECK(parse(file(" \t\r\n{}", 0)).tensors.empty());
  std::vector<std::byte> huge(16);
  const std::uint64_t n = 200'000'000;
  std::memcpy(huge.data(), &n, 8);
  RLPT_CHECK_ERROR(parse(huge), "rlpt.sync.bad_safetensors", "header length 200000000 exceeds the limit 100000000");
  RLPT_CHECK_ERROR(safetensors_file("/nonexistent/x.safetensors"), "rlpt.sync.io", "cannot open");
}

TEST_CASE("safetensors: fuzzed files parse or fail cleanly, what parses stays inside the file") {
  const auto seed = read_file(rlpt::test::golden_path("sync", "py_every_dtype.safetensors"));
  int accepted = 0;
  fuzz(seed, 8000, 41, [&](const std::vector<std::byte>& in) {
    const safetensors_header h = parse_safetensors_header(in, in.size(), "fuzz");
    ++accepted;
    for (const auto& t : h.tensors) CHECK(8 + h.header_bytes + t.end <= in.size());
  });
  CHECK(accepted > 0);
}

TEST_CASE("safetensors: write_safetensors publishes atomically and round-trips") {
  temp_dir dir;
  auto ts = golden_tensors(3);
  const auto refs = refs_of(ts);
  const std::string path = dir.path + "/model.safetensors";
  write_safetensors(path, refs, {{"format", "pt"}});
  CHECK(dir.files() == std::vector<std::string>{"model.safetensors"}); // no temporary left behind
  const safetensors_file f(path);
  for (const auto& t : ts) CHECK(same_bytes(f.tensor(t.name).bytes, t.bytes));
  CHECK(read_file(path) == serialize_safetensors(refs, {{"format", "pt"}}));
  RLPT_CHECK_ERROR(write_safetensors(dir.path + "/x.safetensors",
                                     std::vector<tensor_ref>{{"a", wire_dtype::f32, {1}, ts[0].bytes.data()},
                                                             {"a", wire_dtype::bf16, {1}, ts[0].bytes.data()}}),
                   "rlpt.sync.bad_safetensors", "tensor name \"a\" appears twice");
}

TEST_CASE("safetensors: a failed write keeps the old file, concurrent writers of one path each publish whole") {
  temp_dir dir;
  auto ts = golden_tensors(3);
  const auto refs = refs_of(ts);
  const std::string path = dir.path + "/model.safetensors";
  write_safetensors(path, refs);
  const auto before = read_file(path);
  // The last tensor has no data: found while the temporary file is written.
  auto broken = refs;
  broken.back().data = nullptr;
  RLPT_CHECK_ERROR(write_safetensors(path, broken), "rlpt.sync.bad_source", "has no data");
  CHECK(read_file(path) == before);
  CHECK(dir.files() == std::vector<std::string>{"model.safetensors"});

  // Two threads of one process write the same path: each file is one writer's whole bytes.
  const std::vector<tensor_ref> one(refs.begin(), refs.begin() + 1);
  const auto a = serialize_safetensors(refs), b = serialize_safetensors(one);
  std::thread t1([&] {
    for (int r = 0; r < 40; ++r) write_safetensors(path, refs);
  });
  std::thread t2([&] {
    for (int r = 0; r < 40; ++r) write_safetensors(path, one);
  });
  t1.join();
  t2.join();
  const auto got = read_file(path);
  CHECK((got == a || got == b));
  CHECK(dir.files() == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("safetensors transport: dense and delta versions as files, replayed by a receiver") {
  temp_dir dir;
  auto md = make_model(41);
  const manifest m = plan(md.refs, {.bucket_bytes = 1024, .alignment = 256});
  safetensors_transport out(dir.path, role::sender);
  sender tx(out, m, md.refs, {.delta = true});
  rlpt::test::rng r(5);
  CHECK_FALSE(tx.publish(1).delta);
  md.step(0.02, r);
  CHECK(tx.publish(2).delta);
  md.step(0.02, r);
  CHECK(tx.publish(3).delta);
  CHECK(dir.files() == std::vector<std::string>{fmt::format("rlpt-v{:020}.safetensors", 1),
                                                fmt::format("rlpt-v{:020}.delta.safetensors", 2),
                                                fmt::format("rlpt-v{:020}.delta.safetensors", 3)});
  // The dense file is a plain safetensors file of the first version.
  {
    auto v1 = make_model(41);
    const safetensors_file f(out.dense_path(1));
    CHECK(f.header().meta("format") == std::optional<std::string_view>("pt"));
    for (const auto& t : v1.refs) CHECK(same_bytes(f.tensor(t.name).bytes, v1.bytes(t.name)));
  }
  safetensors_transport in(dir.path, role::receiver);
  sink s;
  receiver rx(in, s.fn());
  receiver_loop loop(rx);
  const auto ups = loop.wait(3);
  // A receiver is one thread's: its mirror is read once its poll loop has stopped. (Files carry
  // no happens-before that ThreadSanitizer sees, so reading it while the loop polls reads as a race.)
  loop.stop();
  REQUIRE(ups.size() == 3);
  CHECK(ups[0].version == 1);
  CHECK(ups[2].version == 3);
  CHECK(ups[2].delta);
  check_mirror(rx, md);
  // A new dense anchor prunes what a reader no longer needs; the receiver follows.
  md.step(0.02, r);
  sender tx2(out, m, md.refs); // a restarted trainer: dense
  tx2.publish(4);
  CHECK(dir.files() == std::vector<std::string>{fmt::format("rlpt-v{:020}.safetensors", 4)});
  receiver_loop loop2(rx);
  const auto more = loop2.wait(1);
  loop2.stop();
  REQUIRE(more.size() == 1);
  CHECK(more[0].version == 4);
  check_mirror(rx, md);
}

TEST_CASE("safetensors transport: a corrupted file is rejected and skipped, the next version is taken") {
  temp_dir dir;
  auto md = make_model(42);
  const manifest m = plan(md.refs, {.bucket_bytes = 1024, .alignment = 256});
  safetensors_transport out(dir.path, role::sender, {.prune = false});
  sender tx(out, m, md.refs);
  tx.publish(1);
  safetensors_transport in(dir.path, role::receiver);
  sink s;
  receiver rx(in, s.fn());
  receiver_loop loop(rx);
  REQUIRE(loop.wait(1).size() == 1);
  const auto v1 = md;
  rlpt::test::rng r(6);
  md.step(0.3, r);
  loop.stop();
  tx.publish(2);
  {
    // Flip a byte inside a tensor of the new file, as a bad disk would.
    const safetensors_file f(out.dense_path(2));
    const auto at = 8 + f.header().header_bytes + f.header().find("model.embed_tokens.weight")->begin + 17;
    std::fstream io(out.dense_path(2), std::ios::in | std::ios::out | std::ios::binary);
    io.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    io.read(&c, 1);
    c = static_cast<char>(c ^ 0x20);
    io.seekp(static_cast<std::streamoff>(at));
    io.write(&c, 1);
  }
  receiver_loop loop2(rx);
  auto ups = loop2.wait(1);
  loop2.stop(); // the mirror is read below (see the test above)
  REQUIRE(ups.size() == 1);
  CHECK(ups[0].failed());
  CHECK(ups[0].error_id == "rlpt.sync.checksum");
  CHECK(ups[0].reason.find("model.embed_tokens.weight") != std::string::npos);
  CHECK(rx.version() == 1);
  auto v1_copy = v1;
  check_mirror(rx, v1_copy);
  md.step(0.01, r);
  tx.publish(3);
  receiver_loop loop3(rx);
  ups = loop3.wait(1);
  loop3.stop();
  REQUIRE(ups.size() == 1);
  CHECK(ups[0].published());
  CHECK(ups[0].version == 3);
  check_mirror(rx, md);
}
