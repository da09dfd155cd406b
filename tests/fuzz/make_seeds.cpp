// SPDX-License-Identifier: Apache-2.0
// rlpt_fuzz_seeds <corpus dir>: writes the generated seeds (seeds.hpp) as
// <corpus dir>/<target>/seed-<name>, replacing earlier seed files; other corpus files (crashes
// added by hand, inputs kept from fuzzing runs) are left alone. Run by scripts/fuzz --seeds.
#include "seeds.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  const fs::path root(argv[1]);
  std::size_t files = 0, bytes = 0;
  for (const auto& set : rlpt::fuzz::seed_sets) {
    const fs::path dir = root / std::string(set.target);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("seed-", 0) == 0) fs::remove(e.path());
    for (const auto& s : set.make()) {
      std::ofstream out(dir / ("seed-" + s.name), std::ios::binary);
      out.write(reinterpret_cast<const char*>(s.bytes.data()), static_cast<std::streamsize>(s.bytes.size()));
      ++files;
      bytes += s.bytes.size();
    }
  }
  std::printf("rlpt_fuzz_seeds: wrote %zu seeds (%zu bytes) under %s\n", files, bytes, root.c_str());
  return 0;
}
