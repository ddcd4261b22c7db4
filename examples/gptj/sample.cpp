// Generation with a KV cache, on any mesh, from a checkpoint saved on any mesh.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "checkpoint.h"
#include "train.h"

namespace gptj {

using namespace nax;

namespace {

// Picks the next token from full-vocabulary logits: temperature, then top-k, then a draw.
std::int32_t choose(const std::vector<double>& logits, const SampleOptions& o, std::uint64_t draw) {
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]; });
  if (o.temperature <= 0) return order[0];
  const std::size_t k = o.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(o.top_k), order.size()) : order.size();
  std::vector<double> weights(k);
  const double top = logits[static_cast<std::size_t>(order[0])];
  for (std::size_t i = 0; i < k; ++i) weights[i] = std::exp((logits[static_cast<std::size_t>(order[i])] - top) / o.temperature);
  double u = rng::uniform(rng::make_key(o.seed, "sample"), draw) * std::accumulate(weights.begin(), weights.end(), 0.0);
  for (std::size_t i = 0; i < k; ++i) {
    u -= weights[i];
    if (u <= 0) return order[i];
  }
  return order[k - 1];
}

}  // namespace

std::string sample(const SampleOptions& o) {
  if (o.ckpt_dir.empty()) fail("sample", "--ckpt DIR is required");
  if (o.tokens < 0) fail("sample", "--tokens must be at least 0, got {}", o.tokens);
  const Config config = config_from_json(read_file(o.ckpt_dir + "/config.json"));
  const Mesh mesh = Mesh::parse(o.mesh);
  check_fits(config, mesh, mesh.has("dp") ? mesh.axis_size("dp") : 1);
  const auto specs = parameter_specs(config);
  const auto file = load_safetensors(o.ckpt_dir + "/model.safetensors");
  std::vector<Tensor> globals;
  for (const auto& spec : specs) {
    auto it = file.find(spec.name);
    if (it == file.end()) fail("sample", "'{}/model.safetensors' has no tensor '{}'", o.ckpt_dir, spec.name);
    if (it->second.numel() != spec.global.numel())
      fail("sample", "tensor '{}' has {} elements, the config expects {}", spec.name, it->second.numel(), spec.global.numel());
    globals.push_back(cast(it->second.with_shape(spec.global), DType::f32));
  }
  std::vector<std::int32_t> tokens = encode(o.prompt.empty() ? std::string("\n") : o.prompt);
  if (static_cast<std::int64_t>(tokens.size()) + o.tokens > config.max_seq)
    fail("sample", "prompt ({} tokens) plus --tokens {} exceeds the context of {}", tokens.size(), o.tokens, config.max_seq);

  AxisRules rules = axis_rules(mesh);
  rules.set("batch", {});  // one sequence, the same on every data-parallel replica
  Runtime rt = Runtime::local(mesh);
  return rt.run([&](Shard& s) {
    NoGrad no_grad;
    std::vector<Tensor> values;
    for (const auto& g : globals) values.push_back(s.shard(g, rules));
    Model model(config, nn::Parameters::from_values(specs, std::move(values)));
    std::vector<KVCache> caches;
    Tensor input = from_vector(Shape{{"batch", 1}, {"seq", static_cast<std::int64_t>(tokens.size())}}, tokens);
    std::vector<std::int32_t> generated;
    for (std::int64_t i = 0; i < o.tokens; ++i) {
      Tensor logits = model.logits(s.shard(input, rules), &caches);
      const std::int64_t last = logits.shape().size("seq") - 1;
      Tensor next = all_gather_invariant(slice(logits, "seq", last, last + 1), "mp", "vocab");
      const std::int32_t token = choose(next.to_vector<double>(), o, static_cast<std::uint64_t>(i));
      generated.push_back(token);
      input = from_vector(Shape{{"batch", 1}, {"seq", 1}}, std::vector<std::int32_t>{token});
    }
    return decode(generated);
  })[0];
}

}  // namespace gptj
