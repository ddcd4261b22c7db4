#include "hf_export.h"

#include <nlohmann/json.hpp>

#include "checkpoint.h"
#include "model.h"
#include "train.h"

namespace gptj {

using namespace nax;

std::vector<std::string> convert(const ConvertOptions& o) {
  if (o.out.empty()) fail("convert", "no output folder (--out DIR)");
  if (checkpoint::looks_like_step_folder(o.out))  // it would be read back as a step folder without its manifest, and refused
    fail("convert", "--out '{}' is, or is inside, a run's step folders: write a Hugging Face folder elsewhere", o.out);
  const std::string stored = checkpoint::parse_stored_dtype(o.dtype, "--dtype");
  const ModelFiles model = open_model(o.from, nonfinite_policy(o.allow_nonfinite));
  const auto specs = parameter_specs(model.config);
  const auto reads = model_reads(specs);
  double largest = 0;  // one global tensor at a time, f32 and its converted copy
  for (const auto& r : reads) largest = std::max(largest, 8.0 * static_cast<double>(r.global.numel()));
  check_host_memory("convert", fmt::format("the largest tensor of '{}'", model.folder), largest);
  const Mesh mesh = Mesh::parse("dp=1,mp=1");  // one device: a tensor in memory at a time
  Runtime rt = Runtime::local(mesh);
  std::vector<std::string> files;
  rt.run([&](Shard& s) {
    std::vector<checkpoint::LazyShardedTensor> tensors;
    for (const auto& r : reads)
      tensors.push_back({r.name, r.global, r.stored_dims, [&, r] { return s.shard(model.weights.read(r.name, r.global, DType::f32), AxisRules{}); }});
    files = checkpoint::save_sharded_folder(s, o.out, tensors, stored, o.max_file_bytes);
  });
  nlohmann::json config = hf_config(model.config);
  config["torch_dtype"] = stored == "F32" ? "float32" : stored == "BF16" ? "bfloat16" : "float16";
  io::write_file_atomically(o.out + "/config.json", config.dump(2) + "\n");
  files.push_back("config.json");
  return files;
}

}  // namespace gptj
