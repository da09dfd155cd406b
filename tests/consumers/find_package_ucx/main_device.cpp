// ucx_device_link from an installed rlpt (components ucx and cuda): it compiles and links with
// the two components' targets alone, and opens a listening link where UCX moves CUDA memory and
// a GPU is there; elsewhere it is refused by a named error (a UCX without CUDA: rlpt.sync.ucx;
// no device: rlpt.cuda.error), never a crash.
#include <rlpt/cuda/sync/ucx_link.cuh>

#include <cstdio>
#include <string>

int main() {
  using namespace rlpt::sync;
  try {
    const ucx_device_link rx({.listen = true}, role::receiver);
    std::printf("listening: %s\n", rx.info().name.c_str());
    return 0;
  } catch (const rlpt::error& e) {
    const std::string id = e.id();
    std::printf("refused (%s): %s\n", id.c_str(), e.what());
    return id == "rlpt.sync.ucx" || id == "rlpt.cuda.error" ? 0 : 1;
  }
}
