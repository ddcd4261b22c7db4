#include "nax/checkpoint/safetensors_folder.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/agreement.h"
#include "nax/autodiff/autodiff.h"
#include "nax/io/files.h"
#include "nax/io/json.h"
#include "nax/ops/ops.h"

namespace nax::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

bool exists(const std::string& path) {
  std::error_code ec;
  return fs::exists(path, ec);
}

[[noreturn]] void refuse_pickles(const std::string& dir, const std::string& file) {
  fail("checkpoint",
       "'{}/{}' is a PyTorch pickle, which nax does not read (unpickling can run code): convert the folder to safetensors "
       "with transformers, `GPTJForCausalLM.from_pretrained(\"{}\").save_pretrained(OUT_DIR, safe_serialization=True)`, and copy "
       "config.json with it",
       dir, file, dir);
}

// The shard files an index maps tensors to, after checking its form.
std::map<std::string, std::string> weight_map(const std::string& dir) {
  const io::JsonValue index = io::read_json(dir + "/" + kWeightsIndexFile, io::kWeightsIndexCaps, "checkpoint");
  if (!index.is_object()) index.fail("is {}, not an object with a 'weight_map'", index.brief());
  const io::JsonValue files = index.at("weight_map");
  if (!files.is_object() || files.size() == 0) files.fail("is {}, not an object of tensor names to files", files.brief());
  std::map<std::string, std::string> map;
  files.for_each_member([&](const std::string& name, const io::JsonValue& file) {
    const std::string& f = file.string();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == ".." || !f.ends_with(".safetensors"))
      file.fail("is '{}', not a .safetensors file in the folder", f);
    map[name] = f;
  });
  return map;
}

}  // namespace

SafetensorsFolder::SafetensorsFolder(const std::string& dir, ChecksumPolicy checksum, NonFinitePolicy nonfinite) : dir_(dir) {
  const bool single = exists(dir + "/" + kSingleWeightsFile), indexed = exists(dir + "/" + kWeightsIndexFile);
  if (single && indexed)
    fail("checkpoint", "'{}' holds both {} and {}: two sets of weights, remove one", dir, kSingleWeightsFile, kWeightsIndexFile);
  if (!single && !indexed) {
    for (const char* pickle : {"pytorch_model.bin.index.json", "pytorch_model.bin"})
      if (exists(dir + "/" + pickle)) refuse_pickles(dir, pickle);
    fail("checkpoint", "'{}' holds neither {} nor {} (a Hugging Face model folder's weights)", dir, kSingleWeightsFile, kWeightsIndexFile);
  }
  if (single) {
    files_.push_back(std::make_shared<SafetensorsReader>(dir + "/" + kSingleWeightsFile, checksum, nonfinite));
    for (const auto& t : files_[0]->tensors()) owner_[t.name] = 0;
    return;
  }
  const auto map = weight_map(dir);
  std::map<std::string, std::size_t> file_index;
  for (const auto& [name, file] : map) file_index.emplace(file, 0);
  for (auto& [file, i] : file_index) {
    i = files_.size();
    try {
      files_.push_back(std::make_shared<SafetensorsReader>(dir + "/" + file, checksum, nonfinite));
    } catch (const Error& e) {  // named with the index that sent the reader there
      fail("checkpoint", "'{}/{}' maps tensors to '{}', which is refused: {}", dir, kWeightsIndexFile, file, e.what());
    }
  }
  for (const auto& [name, file] : map) {
    const std::size_t i = file_index.at(file);
    if (files_[i]->find(name) == nullptr)
      fail("checkpoint", "'{}/{}' maps tensor '{}' to '{}', which does not hold it", dir, kWeightsIndexFile, name, files_[i]->path());
    owner_[name] = i;
  }
  for (const auto& file : files_)
    for (const auto& t : file->tensors()) {
      auto it = map.find(t.name);
      if (it == map.end() || dir + "/" + it->second != file->path())
        fail("checkpoint", "'{}' holds tensor '{}', which '{}/{}' {}", file->path(), t.name, dir, kWeightsIndexFile,
             it == map.end() ? std::string("does not list") : "maps to '" + it->second + "'");
    }
}

std::vector<std::string> SafetensorsFolder::files() const {
  std::vector<std::string> paths;
  for (const auto& f : files_) paths.push_back(f->path());
  return paths;
}

std::vector<TensorInfo> SafetensorsFolder::tensors() const {
  std::vector<TensorInfo> all;
  for (const auto& f : files_) all.insert(all.end(), f->tensors().begin(), f->tensors().end());
  return all;
}

const TensorInfo* SafetensorsFolder::find(const std::string& name) const {
  auto it = owner_.find(name);
  return it == owner_.end() ? nullptr : files_[it->second]->find(name);
}

const SafetensorsReader& SafetensorsFolder::file_of(const std::string& name) const {
  auto it = owner_.find(name);
  if (it == owner_.end()) fail("checkpoint", "'{}' has no tensor '{}' (in {})", dir_, name, files_.size() == 1 ? kSingleWeightsFile : kWeightsIndexFile);
  return *files_[it->second];
}

Tensor SafetensorsFolder::read(const std::string& name, const Shape& shape, DType dtype) const {
  const SafetensorsReader& file = file_of(name);
  Tensor t = file.read(name, shape);
  if (t.dtype() == dtype) return t;
  if (!is_floating(t.dtype()) || !is_floating(dtype))
    fail("checkpoint", "'{}': tensor '{}' is {}, which does not convert to {}", file.path(), name, safetensors_dtype(*file.find(name)),
         dtype_name(dtype));
  return cast(t, dtype);
}

void expect_tensors(const SafetensorsFolder& folder, const std::vector<ShardedRead>& tensors) {
  for (const auto& t : tensors) {
    const SafetensorsReader& file = folder.file_of(t.name);
    const TensorInfo& info = expect_tensor(file, t);
    if (!is_floating(info.dtype))
      fail("checkpoint", "'{}': tensor '{}' is {}, not a floating type (F32, F16, BF16, F64)", file.path(), t.name, safetensors_dtype(info));
  }
}

std::vector<Tensor> load_sharded(Shard& s, const SafetensorsFolder& folder, const std::vector<ShardedRead>& tensors, const AxisRules& rules,
                                 DType dtype) {
  return detail::load_blocks(s, folder.dir(), tensors, rules, [&](const ShardedRead& t) { return folder.read(t.name, t.global, dtype); });
}

std::string parse_stored_dtype(const std::string& name, const std::string& flag) {
  std::string n = name;
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (n == "F32" || n == "FLOAT32") return "F32";
  if (n == "BF16" || n == "BFLOAT16") return "BF16";
  if (n == "F16" || n == "FLOAT16") return "F16";
  fail("checkpoint", "{} is '{}': the weights are written as f32, bf16 or f16", flag, name);
}

std::vector<std::string> save_sharded_folder(Shard& s, const std::string& dir, const std::vector<LazyShardedTensor>& tensors,
                                             const std::string& stored, std::uint64_t max_file_bytes, const Metadata& metadata) {
  const std::string kind = parse_stored_dtype(stored, "the stored dtype");
  if (max_file_bytes == 0) fail("save_sharded_folder", "'{}': the largest file size must be positive", dir);
  const std::uint64_t element = kind == "F32" ? 4 : 2;
  // Files: consecutive tensors while they fit (a tensor larger than the limit alone).
  std::vector<std::vector<std::size_t>> files(1);
  std::vector<std::uint64_t> bytes(1, 0);
  std::uint64_t total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t n = static_cast<std::uint64_t>(tensors[i].global.numel()) * element;
    if (!files.back().empty() && bytes.back() + n > max_file_bytes) files.emplace_back(), bytes.push_back(0);
    files.back().push_back(i), bytes.back() += n, total += n;
  }
  std::vector<std::string> names;
  for (std::size_t f = 0; f < files.size(); ++f)
    names.push_back(files.size() == 1 ? std::string(kSingleWeightsFile) : fmt::format("model-{:05d}-of-{:05d}.safetensors", f + 1, files.size()));

  std::vector<std::string> entries{fmt::format("stored dtype {}, files of at most {} bytes", kind, max_file_bytes)};
  for (std::size_t k = 0; k < tensors.size(); ++k)
    entries.push_back(detail::tensor_entry(k, tensors[k].name, "", tensors[k].global, tensors[k].stored_dims));
  detail::require_same_on_every_device(s, "save_sharded_folder", fmt::format("tensors to save in '{}' (names in the same order, global "
                                       "shapes and stored dims, the stored dtype and the file size)", dir), entries);
  const bool writer = s.device() == 0;
  if (writer) {
    std::error_code ec;
    if (fs::exists(dir, ec) && (!fs::is_directory(dir, ec) || !fs::is_empty(dir, ec)))
      fail("save_sharded_folder", "'{}' exists and is not an empty folder (weights would mix with what it holds)", dir);
    fs::create_directories(dir, ec);
    if (ec) fail("save_sharded_folder", "cannot create '{}': {}", dir, ec.message());
  }
  Metadata meta = metadata;
  meta.emplace("format", "pt");  // what transformers expects of a PyTorch-side file
  json map = json::object();
  for (std::size_t f = 0; f < files.size(); ++f) {
    std::unique_ptr<SafetensorsWriter> file;
    if (writer) {
      std::vector<TensorInfo> infos;
      for (auto i : files[f]) {
        const LazyShardedTensor& t = tensors[i];
        std::vector<std::int64_t> dims = t.stored_dims;
        if (dims.empty())
          for (const auto& a : t.global.axes()) dims.push_back(a.size);
        TensorInfo info{t.name, kind == "BF16" ? DType::bf16 : DType::f32, dims};
        info.f16 = kind == "F16";
        info.axes = t.global.axes();
        infos.push_back(info);
        map[t.name] = names[f];
      }
      file = std::make_unique<SafetensorsWriter>(dir + "/" + names[f], std::move(infos), meta);
    }
    for (auto i : files[f]) {
      const LazyShardedTensor& t = tensors[i];
      const Tensor block = t.block();
      if (block.dtype() != DType::f32) fail("save_sharded_folder", "'{}': tensor '{}' is {}, not f32", dir, t.name, dtype_name(block.dtype()));
      Tensor global = s.gather(stop_gradient(block));  // one global tensor alive at a time
      if (global.shape() != t.global)
        fail("save_sharded_folder", "'{}': tensor '{}' gathers to {}, announced as {}", dir, t.name, global.shape().str(), t.global.str());
      if (file) file->write(kind == "BF16" ? cast(global, DType::bf16) : global);
    }
    if (file) file->commit();
  }
  if (writer && files.size() > 1) {
    const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    io::write_file_atomically(dir + "/" + kWeightsIndexFile, index.dump(2) + "\n");
    names.push_back(kWeightsIndexFile);
  }
  return names;
}

}  // namespace nax::checkpoint
