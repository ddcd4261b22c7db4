#include "checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace gptj {

using nlohmann::json;

namespace {

std::string safetensors_dtype(nax::DType d) {
  switch (d) {
    case nax::DType::f32: return "F32";
    case nax::DType::f64: return "F64";
    case nax::DType::bf16: return "BF16";
    case nax::DType::i32: return "I32";
  }
  return "?";
}

nax::DType dtype_from(const std::string& s, const std::string& path) {
  for (auto d : {nax::DType::f32, nax::DType::f64, nax::DType::bf16, nax::DType::i32})
    if (safetensors_dtype(d) == s) return d;
  nax::fail("load_safetensors", "'{}': unsupported dtype '{}'", path, s);
}

std::uint64_t fnv1a(const char* data, std::size_t n, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) nax::fail("checkpoint", "cannot create '{}': {}", tmp, std::strerror(errno));
  std::size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n <= 0) {
      ::close(fd);
      nax::fail("checkpoint", "writing '{}' failed: {}", tmp, std::strerror(errno));
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) nax::fail("checkpoint", "flushing '{}' failed: {}", tmp, std::strerror(errno));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) nax::fail("checkpoint", "renaming '{}' to '{}' failed: {}", tmp, path, std::strerror(errno));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) nax::fail("checkpoint", "cannot read '{}'", path);
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    if (!t.device().is_host()) nax::fail("save_safetensors", "'{}' is {} on {}: gather it to the host first", name, t.str(), t.device().str());
    json shape = json::array();
    for (const auto& a : t.shape().axes()) shape.push_back(a.size);
    header[name] = {{"dtype", safetensors_dtype(t.dtype())}, {"shape", shape}, {"data_offsets", {data.size(), data.size() + t.nbytes()}}};
    data.append(static_cast<const char*>(t.raw()), t.nbytes());
  }
  json meta = json::object();
  for (const auto& [k, v] : metadata) meta[k] = v;
  meta["nax.checksum"] = fmt::format("{:016x}", fnv1a(data.data(), data.size()));
  header["__metadata__"] = meta;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  std::string file(8, '\0');
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  write_file_atomically(path, file + text + data);
}

std::map<std::string, nax::Tensor> load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  const std::string file = read_file(path);
  if (file.size() < 8) nax::fail("load_safetensors", "'{}' is truncated ({} bytes)", path, file.size());
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[static_cast<std::size_t>(i)]);
  if (n > file.size() - 8) nax::fail("load_safetensors", "'{}' is truncated or corrupt: header of {} bytes in a {}-byte file", path, n, file.size());
  json header;
  try {
    header = json::parse(file.substr(8, n));
  } catch (const std::exception& e) {
    nax::fail("load_safetensors", "'{}' has a corrupt header: {}", path, e.what());
  }
  const char* data = file.data() + 8 + n;
  const std::size_t data_size = file.size() - 8 - n;
  const auto meta = header.value("__metadata__", json::object());
  if (!meta.contains("nax.checksum")) nax::fail("load_safetensors", "'{}' has no nax.checksum in its metadata", path);
  const std::string want = meta["nax.checksum"].get<std::string>(), got = fmt::format("{:016x}", fnv1a(data, data_size));
  if (want != got) nax::fail("load_safetensors", "'{}' fails its checksum (stored {}, computed {}): the file is corrupt or truncated", path, want, got);
  if (metadata != nullptr)
    for (const auto& [k, v] : meta.items()) (*metadata)[k] = v.get<std::string>();

  std::map<std::string, nax::Tensor> out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const nax::DType dtype = dtype_from(entry.at("dtype").get<std::string>(), path);
    std::vector<nax::Axis> axes;
    for (const auto& d : entry.at("shape")) axes.push_back({fmt::format("d{}", axes.size()), d.get<std::int64_t>()});
    const nax::Shape shape(axes);
    const auto begin = entry.at("data_offsets")[0].get<std::size_t>(), end = entry.at("data_offsets")[1].get<std::size_t>();
    if (end < begin || end > data_size || end - begin != static_cast<std::size_t>(shape.numel()) * nax::dtype_size(dtype))
      nax::fail("load_safetensors", "'{}': tensor '{}' has offsets [{}, {}) that do not fit its shape {} or the file", path, name, begin, end,
                shape.str());
    nax::Tensor t = nax::Tensor::empty(shape, dtype, nax::Device::host());
    std::memcpy(t.raw_mutable(), data + begin, end - begin);
    out.emplace(name, t);
  }
  return out;
}

namespace {
// Hugging Face stores the attention projections as 2-D [heads*head_dim, embed] matrices.
std::vector<std::int64_t> hf_dims(const nax::Shape& s) {
  std::vector<std::int64_t> dims;
  for (int i = 0; i < s.rank(); ++i) {
    if (s[i].name == "head_dim" && i > 0 && s[i - 1].name == "heads") dims.back() *= s[i].size;
    else dims.push_back(s[i].size);
  }
  return dims;
}
}  // namespace

nax::Tensor to_hf_layout(const nax::Tensor& t) {
  std::vector<nax::Axis> axes;
  for (auto d : hf_dims(t.shape())) axes.push_back({fmt::format("d{}", axes.size()), d});
  return t.with_shape(nax::Shape(axes));
}

nax::Tensor from_hf_layout(const std::map<std::string, nax::Tensor>& tensors, const std::string& name, const nax::Shape& shape,
                           const std::string& path) {
  auto it = tensors.find(name);
  if (it == tensors.end()) nax::fail("checkpoint", "'{}' has no tensor '{}'", path, name);
  std::vector<std::int64_t> dims;
  for (const auto& a : it->second.shape().axes()) dims.push_back(a.size);
  if (dims != hf_dims(shape))
    nax::fail("checkpoint", "'{}': tensor '{}' has shape [{}], the model expects [{}]", path, name, fmt::join(dims, ", "),
              fmt::join(hf_dims(shape), ", "));
  return nax::cast(it->second.with_shape(shape), nax::DType::f32);
}

std::string hf_config_json(const Config& c) {
  json j = {{"architectures", {"GPTJForCausalLM"}},
            {"model_type", "gptj"},
            {"vocab_size", c.vocab},
            {"n_positions", c.max_seq},
            {"n_embd", c.d_model},
            {"n_layer", c.n_layers},
            {"n_head", c.n_heads},
            {"n_inner", c.d_ff},
            {"rotary_dim", c.rotary_dims},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", 1e-5},
            {"tie_word_embeddings", false},
            {"bos_token_id", 0},
            {"eos_token_id", 0},
            {"torch_dtype", "float32"},
            {"nax_config", c.name}};
  return j.dump(2) + "\n";
}

Config config_from_json(const std::string& text) {
  json j;
  try {
    j = json::parse(text);
    Config c;
    c.name = j.value("nax_config", std::string("custom"));
    c.vocab = j.at("vocab_size").get<std::int64_t>();
    c.max_seq = j.at("n_positions").get<std::int64_t>();
    c.d_model = j.at("n_embd").get<std::int64_t>();
    c.n_layers = j.at("n_layer").get<std::int64_t>();
    c.n_heads = j.at("n_head").get<std::int64_t>();
    c.head_dim = c.d_model / c.n_heads;
    c.d_ff = j.at("n_inner").get<std::int64_t>();
    c.rotary_dims = j.at("rotary_dim").get<std::int64_t>();
    return c;
  } catch (const std::exception& e) {
    nax::fail("checkpoint", "config.json is not a GPT-J config: {}", e.what());
  }
}

NamedTensors gather_hf_parameters(nax::Shard& s, const nax::nn::Parameters& params) {
  NamedTensors out;
  const auto& specs = params.specs();
  for (std::size_t i = 0; i < specs.size(); ++i) out.push_back({specs[i].name, to_hf_layout(s.gather(nax::stop_gradient(params[i])))});
  return out;
}

}  // namespace gptj
