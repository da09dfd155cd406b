// The second TU: a receiver-side transform, defined in rlpt::compiled.
#include <rlpt/rlpt.hpp>

#include <string>
#include <vector>

std::string renamed_by_transform() {
  using namespace rlpt::sync;
  std::vector<tensor_entry> tensors(1);
  tensors[0].name = "layers.0.q_proj.weight";
  tensors[0].shape = {2, 3};
  tensors[0].nbytes = 2 * 3 * 4; // f32
  const manifest m(std::move(tensors), 1 << 20, 64);
  const transform_plan plan(m, {rename_tensor{"*.q_proj.weight", "*.query.weight"}});
  return plan.outputs().size() == 1 ? plan.outputs()[0].name : std::string();
}
