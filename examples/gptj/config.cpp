#include "config.h"

#include <fmt/format.h>

namespace gptj {

namespace {
Config make(std::string name, std::int64_t vocab, std::int64_t d_model, std::int64_t layers, std::int64_t heads, std::int64_t rotary) {
  return Config{std::move(name), vocab, d_model, layers, heads, d_model / heads, 4 * d_model, rotary, 2048, 1e-5, 0, 0};
}
}  // namespace

std::vector<std::string> config_names() { return {"tiny", "small", "125m", "350m", "1.3b", "6b"}; }

Config config_by_name(const std::string& name) {
  if (name == "tiny") return make(name, 256, 32, 2, 4, 4);
  if (name == "small") return make(name, 256, 256, 6, 8, 16);
  if (name == "125m") return make(name, 50400, 768, 12, 12, 32);
  if (name == "350m") return make(name, 50400, 1024, 24, 16, 32);
  if (name == "1.3b") return make(name, 50400, 2048, 24, 16, 64);
  if (name == "6b") return make(name, 50400, 4096, 28, 16, 64);
  nax::fail("config", "unknown config '{}' (known: {})", name, fmt::join(config_names(), ", "));
}

Config with_vocab_at_least(Config c, std::int64_t vocab, const nax::Mesh& mesh) {
  if (vocab <= c.vocab) return c;
  const std::int64_t mp = mesh.has("mp") ? mesh.axis_size("mp") : 1;
  c.vocab = (vocab + mp - 1) / mp * mp;
  return c;
}

Config padded_for(Config c, const nax::Mesh& mesh) {
  if (c.vocab == 256 && mesh.has("mp")) {
    const std::int64_t mp = mesh.axis_size("mp");
    c.vocab = (c.vocab + mp - 1) / mp * mp;
  }
  return c;
}

nax::Mesh model_mesh(const std::string& spec) {
  const nax::Mesh parsed = nax::Mesh::parse(spec);
  std::vector<nax::Axis> axes;
  for (const char* axis : {"dp", "mp"})
    if (!parsed.has(axis)) axes.push_back({axis, 1});
  for (const auto& axis : parsed.axes()) axes.push_back(axis);
  return nax::Mesh(axes);
}

void check_micro_batches(const nax::Mesh& mesh, std::int64_t batch, std::int64_t micro, const char* command) {
  const std::int64_t per_device = batch / data_parallel_devices(mesh);
  if (micro < 1 || per_device % micro != 0) nax::fail(command, "--micro-batches {} does not divide the per-device batch {}", micro, per_device);
}

void check_fits(const Config& c, const nax::Mesh& mesh, std::int64_t batch) {
  for (const auto& axis : mesh.axis_names())
    if (axis != "dp" && axis != "mp" && axis != "cp" && axis != "fsdp" && axis != "pp")
      nax::fail("mesh", "the mesh {} has axis '{}', which the GPT-J model does not use (its axes: dp, mp, pp, cp and fsdp)", mesh.str(), axis);
  if (mesh.size() > kMaxDevices)
    nax::fail("mesh", "the mesh {} has {} devices, more than the {} gptj runs (a thread or process each)", mesh.str(), mesh.size(), kMaxDevices);
  for (const char* axis : {"dp", "mp"})
    if (!mesh.has(axis)) nax::fail("mesh", "the mesh {} has no '{}' axis (use e.g. --mesh dp=2,mp=2)", mesh.str(), axis);
  const std::int64_t mp = mesh.axis_size("mp"), dp = mesh.axis_size("dp");
  auto require_divides = [&](const char* what, std::int64_t size, std::int64_t parts, const char* axis) {
    if (size % parts != 0)
      nax::fail("mesh", "{} = {} of config '{}' is not divisible by {}={} of mesh {}", what, size, c.name, axis, parts, mesh.str());
  };
  require_divides("heads", c.n_heads, mp, "mp");
  require_divides("d_ff", c.d_ff, mp, "mp");
  require_divides("vocab", c.vocab, mp, "mp");
  require_divides("d_model", c.d_model, fsdp_devices(mesh), "fsdp");
  if (c.n_layers < pipeline_stages(mesh))
    nax::fail("mesh", "pp={} of mesh {} needs at least one layer per stage; config '{}' has {} layers", pipeline_stages(mesh), mesh.str(),
              c.name, c.n_layers);
  if (batch % data_parallel_devices(mesh) != 0)
    nax::fail("mesh", "batch = {} is not divisible by {} of mesh {}{}", batch,
              mesh.has("fsdp") ? fmt::format("dp x fsdp = {}", data_parallel_devices(mesh)) : fmt::format("dp={}", dp), mesh.str(),
              mesh.has("fsdp") ? " (FSDP is data parallel too)" : "");
}

bool dp_mp_only(const nax::Mesh& mesh) { return context_devices(mesh) == 1 && fsdp_devices(mesh) == 1 && pipeline_stages(mesh) == 1; }

bool placed_automatically(const nax::Mesh& mesh) { return context_devices(mesh) == 1 && pipeline_stages(mesh) == 1; }

void check_dp_mp_only(const nax::Mesh& mesh, const char* what) {
  if (context_devices(mesh) > 1)
    nax::fail("mesh", "{} has no context parallelism: the mesh {} cuts the sequence over cp (use dp and mp)", what, mesh.str());
  if (fsdp_devices(mesh) > 1)
    nax::fail("mesh", "{} has no FSDP: the mesh {} cuts the parameters over fsdp (use dp and mp)", what, mesh.str());
  if (pipeline_stages(mesh) > 1)
    nax::fail("mesh", "{} has no pipeline: the mesh {} cuts the layers into stages over pp (use dp and mp)", what, mesh.str());
}

namespace {

// Deterministic mode runs cp as sequence parallelism with the heads and mlp columns cut over cp
// beside mp (block.h): contiguous blocks of seq, and the projections cut mp-major, as the mode's
// psums add them.
void check_deterministic_context(const nax::Mesh& mesh, std::int64_t seq, const Config& c) {
  const std::int64_t cp = context_devices(mesh), mp = mesh.axis_size("mp");
  if (seq % cp != 0)
    nax::fail("mesh", "--deterministic cuts the sequence over cp in {} blocks: seq = {} is not divisible by cp={} (mesh {})", cp, seq,
              cp, mesh.str());
  for (const auto& [what, size] : {std::pair<const char*, std::int64_t>{"heads", c.n_heads}, {"d_ff", c.d_ff}})
    if (size % (mp * cp) != 0)
      nax::fail("mesh", "--deterministic on cp={} cuts the {} over mp and cp: {} = {} of config '{}' is not divisible by mp x cp = {} "
                "(mesh {})", cp, what, what, size, c.name, mp * cp, mesh.str());
  if (mp > 1 && mesh.axis_position("cp") < mesh.axis_position("mp"))
    nax::fail("mesh", "--deterministic on mesh {}: the heads are cut over mp, then within each mp block over cp, and the mode's psums "
              "add the devices in mesh order; list mp before cp (e.g. --mesh mp={},cp={})", mesh.str(), mp, cp);
}

void check_context_parallel(const nax::Mesh& mesh, std::int64_t seq, bool sequence_parallel, bool deterministic, const Config& c) {
  const std::int64_t cp = context_devices(mesh);
  if (cp == 1) return;
  if (sequence_parallel && mesh.axis_size("mp") > 1)
    nax::fail("gptj", "--sequence-parallel on a mesh with cp={} (mesh {}): the sequence would be cut over both cp and mp, which the "
              "model does not do yet; use one of the two", cp, mesh.str());
  if (deterministic) return check_deterministic_context(mesh, seq, c);
  if (seq % (2 * cp) != 0)
    nax::fail("mesh", "context parallelism cuts the sequence into 2 cp = {} chunks (two per device, zigzag): seq = {} is not "
              "divisible by {} (mesh {})", 2 * cp, seq, 2 * cp, mesh.str());
}

void check_sequence_parallel(const nax::Mesh& mesh, std::int64_t seq) {
  const std::int64_t mp = mesh.axis_size("mp");
  if (seq % mp != 0)
    nax::fail("mesh", "--sequence-parallel cuts the sequence over mp: seq = {} is not divisible by mp={} of mesh {}", seq, mp, mesh.str());
}

}  // namespace

void check_sequence_layout(const nax::Mesh& mesh, std::int64_t seq, bool sequence_parallel, bool deterministic, const Config& c) {
  check_context_parallel(mesh, seq, sequence_parallel, deterministic, c);
  if (sequence_parallel) check_sequence_parallel(mesh, seq);
}

std::int64_t parameter_count(const Config& c) {
  const std::int64_t inner = c.n_heads * c.head_dim;
  const std::int64_t per_layer = 2 * c.d_model + 4 * inner * c.d_model + 2 * c.d_ff * c.d_model + c.d_ff + c.d_model;
  return c.n_layers * per_layer + 2 * c.vocab * c.d_model + c.vocab + 2 * c.d_model;
}

double training_bytes_lower_bound(const Config& c, std::int64_t batch, std::int64_t seq) {
  const double tokens = static_cast<double>(batch) * static_cast<double>(seq);
  const double state = 4.0 * 4.0 * static_cast<double>(parameter_count(c));  // value, gradient, m, v
  const double per_layer = tokens * static_cast<double>(4 * c.d_model + c.d_ff);
  const double activations = 4.0 * (static_cast<double>(c.n_layers) * per_layer + 2.0 * tokens * static_cast<double>(c.vocab));
  return state + activations;
}

double flops_per_token(const Config& c, std::int64_t seq) {
  return 6.0 * static_cast<double>(parameter_count(c)) +
         12.0 * static_cast<double>(c.n_layers * c.n_heads * c.head_dim * seq);
}

}  // namespace gptj
