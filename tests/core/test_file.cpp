// SPDX-License-Identifier: Apache-2.0
#include <rlpt/core/file.hpp>

#include <doctest/doctest.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

struct temp_dir {
  std::string path;
  temp_dir() {
    std::string t = "/tmp/rlpt-file-XXXXXX";
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~temp_dir() {
    for (const auto& f : files()) ::unlink((path + '/' + f).c_str());
    ::rmdir(path.c_str());
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  [[nodiscard]] std::vector<std::string> files() const {
    std::vector<std::string> out;
    DIR* d = ::opendir(path.c_str());
    while (const dirent* e = d ? ::readdir(d) : nullptr)
      if (std::string_view(e->d_name) != "." && std::string_view(e->d_name) != "..") out.emplace_back(e->d_name);
    if (d) ::closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }
};

std::string slurp(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "<missing>";
  char buf[4096];
  for (::ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

struct io_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(std::string_view what, std::string_view where, int err) {
  throw io_error(std::string(what) + ' ' + std::string(where) + ": " + std::to_string(err));
}

void put(const std::string& path, const std::string& content) {
  rlpt::detail::write_durable(
      path,
      [&](int fd, const std::string& tmp) {
        if (const int err = rlpt::detail::pwrite_all(fd, content.data(), content.size(), 0); err != 0)
          fail("cannot write", tmp, err);
      },
      fail);
}

} // namespace

TEST_CASE("write_durable: replaces the file whole, leaves no temporary, keeps the old file when fill throws") {
  temp_dir dir;
  const std::string path = dir.path + "/f.bin";
  put(path, "first");
  CHECK(slurp(path) == "first");
  put(path, std::string(100000, 'x'));
  CHECK(slurp(path) == std::string(100000, 'x'));
  CHECK(dir.files() == std::vector<std::string>{"f.bin"});

  std::string seen_tmp;
  CHECK_THROWS_AS(rlpt::detail::write_durable(
                      path,
                      [&](int fd, const std::string& tmp) {
                        seen_tmp = tmp;
                        CHECK(rlpt::detail::pwrite_all(fd, "partial", 7, 0) == 0);
                        throw std::logic_error("the source went away");
                      },
                      fail),
                  std::logic_error);
  CHECK(seen_tmp.rfind(path + ".tmp." + std::to_string(::getpid()) + '.', 0) == 0);
  CHECK(slurp(path) == std::string(100000, 'x'));
  CHECK(dir.files() == std::vector<std::string>{"f.bin"});

  // A directory that does not exist: the failure names the temporary file, nothing is created.
  std::string message;
  try {
    put(dir.path + "/missing/f.bin", "x");
  } catch (const io_error& e) {
    message = e.what();
  }
  CHECK(message.rfind("cannot create " + dir.path + "/missing/f.bin.tmp.", 0) == 0);
  CHECK(dir.files() == std::vector<std::string>{"f.bin"});
}

TEST_CASE("write_durable: concurrent writers of one path never share a temporary, the file is one of theirs") {
  temp_dir dir;
  const std::string path = dir.path + "/shared.bin";
  constexpr int writers = 4, rounds = 50;
  std::vector<std::thread> threads;
  for (int w = 0; w < writers; ++w)
    threads.emplace_back([&, w] {
      // Distinct lengths: two writers interleaving in one temporary would leave a mixed file.
      const std::string content(static_cast<std::size_t>(1000 + 997 * w), static_cast<char>('a' + w));
      for (int r = 0; r < rounds; ++r) put(path, content);
    });
  for (auto& t : threads) t.join();
  const std::string got = slurp(path);
  bool whole = false;
  for (int w = 0; w < writers; ++w)
    whole = whole || got == std::string(static_cast<std::size_t>(1000 + 997 * w), static_cast<char>('a' + w));
  CHECK(whole);
  CHECK(dir.files() == std::vector<std::string>{"shared.bin"});
}

TEST_CASE("write_durable: removes the temporaries of dead writers only") {
  temp_dir dir;
  const std::string path = dir.path + "/c.bin";
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  const std::string dead = std::to_string(child);
  const std::vector<std::string> names = {
      "c.bin.tmp." + dead + ".0",                       // a dead writer's: removed
      "c.bin.tmp." + std::to_string(::getpid()) + ".9", // this process's (a concurrent write): kept
      "c.bin.tmp.1.3",                                  // pid 1 runs: kept
      "d.bin.tmp." + dead + ".0",                       // another target's: kept
      "c.bin.tmp." + dead + ".x",                       // not a writer's name: kept
  };
  for (const auto& n : names) {
    const int fd = ::open((dir.path + '/' + n).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    REQUIRE(fd >= 0);
    ::close(fd);
  }
  put(path, "v");
  std::vector<std::string> want(names.begin() + 1, names.end());
  want.push_back("c.bin");
  std::sort(want.begin(), want.end());
  CHECK(dir.files() == want);
}

TEST_CASE("temporary_writer parses <target>.tmp.<pid>.<n> and nothing else") {
  using rlpt::detail::temporary_writer;
  CHECK(temporary_writer("a.tmp.12.0", "a") == 12);
  CHECK(temporary_writer("a.tmp.12.345", "a") == 12);
  CHECK(temporary_writer("a.tmp.12.", "a") == -1);
  CHECK(temporary_writer("a.tmp..3", "a") == -1);
  CHECK(temporary_writer("a.tmp.0.3", "a") == -1);
  CHECK(temporary_writer("a.tmp.-4.3", "a") == -1);
  CHECK(temporary_writer("a.tmp.12.3x", "a") == -1);
  CHECK(temporary_writer("ab.tmp.12.3", "a") == -1);
  CHECK(temporary_writer("a.tmp12", "a") == -1);
  CHECK(temporary_writer("a.tmp.99999999999.1", "a") == -1); // beyond a pid
}

TEST_CASE("durable_file: resize sizes the temporary file for writes in any order, and a failed resize abandons it") {
  temp_dir d;
  const std::string path = d.path + "/sized.bin";
  {
    rlpt::detail::durable_file f(path, fail);
    f.resize(64, fail);
    REQUIRE(rlpt::detail::pwrite_all(f.fd(), "tail", 4, 60) == 0); // the end first
    REQUIRE(rlpt::detail::pwrite_all(f.fd(), "head", 4, 0) == 0);
    f.publish(fail);
  }
  const std::string got = slurp(path);
  CHECK(got.size() == 64);
  CHECK(got.substr(0, 4) == "head");
  CHECK(got.substr(60) == "tail");
  CHECK(got.substr(4, 56) == std::string(56, '\0'));
  rlpt::detail::durable_file g(path, fail);
  const std::string tmp = g.temporary();
  bool threw = false;
  try {
    g.resize(~std::uint64_t{0}, fail); // no file has 2^64 - 1 bytes (negative as off_t: EINVAL)
  } catch (const io_error& e) {
    threw = true;
    CHECK(std::string(e.what()).find("cannot size (to 18446744073709551615 bytes) " + tmp) == 0);
  }
  CHECK(threw);
  CHECK(g.fd() == -1);
  CHECK(d.files() == std::vector<std::string>{"sized.bin"}); // the temporary is gone, the file stays
  CHECK(slurp(path).substr(0, 4) == "head");
}
