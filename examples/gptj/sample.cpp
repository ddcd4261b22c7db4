// Generation with a KV cache, on any mesh, from a checkpoint saved on any mesh.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "checkpoint.h"
#include "train.h"

#include <nax/text/bpe_tokenizer.h>

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


// A checkpoint's model, validated, ready to be cut over a mesh one tensor at a time.
struct Loaded {
  ModelFiles files;
  std::vector<nn::ParamSpec> specs;
  Mesh mesh;
  AxisRules rules;
};

Loaded load_for_inference(const SampleOptions& o) {
  if (o.ckpt_dir.empty()) fail("sample", "--ckpt DIR is required");
  const Mesh mesh = Mesh::parse(o.mesh);
  Loaded m{open_model(o.ckpt_dir), {}, mesh, {}};
  check_fits(m.files.config, m.mesh, m.mesh.has("dp") ? m.mesh.axis_size("dp") : 1);
  m.specs = parameter_specs(m.files.config);
  m.rules = axis_rules(m.mesh);
  m.rules.set("batch", {});  // one sequence, the same on every data-parallel replica
  return m;
}

Model model_on(Shard& s, const Loaded& m) {
  return Model(m.files.config, nn::Parameters::from_values(m.specs, checkpoint::load_sharded(s, m.files.weights, model_reads(m.specs), m.rules, DType::f32)));
}

std::vector<std::int32_t> prompt_tokens(const SampleOptions& o, const Loaded& m, std::int64_t generated) {
  const Config& c = m.files.config;
  std::vector<std::int32_t> tokens;
  if (o.tokenizer.empty()) {
    tokens = encode(o.prompt.empty() ? std::string("\n") : o.prompt);
  } else {
    const auto tokenizer = nax::text::BpeTokenizer::from_file(o.tokenizer);
    if (tokenizer.vocab_size() > c.vocab) fail("sample", "tokenizer {} has {} ids, more than the model's vocabulary {}", o.tokenizer, tokenizer.vocab_size(), c.vocab);
    tokens = tokenizer.encode(o.prompt);
    if (tokens.empty()) tokens.push_back(tokenizer.token_to_id("<|endoftext|>").value_or(0));
  }
  const auto context = c.max_seq, prompt = static_cast<std::int64_t>(tokens.size());
  if (prompt > context || generated > context - prompt)  // subtracted, so that no sum overflows
    fail("sample", "the prompt ({} tokens) plus {} generated exceeds the model's context of {} tokens", prompt, generated, context);
  return tokens;
}

std::string text_of(const SampleOptions& o, const std::vector<std::int32_t>& tokens) {
  return o.tokenizer.empty() ? decode(tokens) : nax::text::BpeTokenizer::from_file(o.tokenizer).decode(tokens);
}

}  // namespace

std::vector<std::vector<double>> prompt_logits(const SampleOptions& o) {
  const Loaded m = load_for_inference(o);
  const auto tokens = prompt_tokens(o, m, 0);
  Runtime rt = Runtime::from_env(m.mesh, runtime_options(o.backend));
  return rt.run([&](Shard& s) {
    NoGrad no_grad;
    Model model = model_on(s, m);
    Tensor ids = s.shard(from_vector(Shape{{"batch", 1}, {"seq", static_cast<std::int64_t>(tokens.size())}}, tokens), m.rules);
    auto values = s.gather(all_gather_invariant(model.logits(ids), "mp", "vocab")).to_vector<double>();
    std::vector<std::vector<double>> rows;
    const auto vocab = static_cast<std::size_t>(m.files.config.vocab);
    for (std::size_t i = 0; i < tokens.size(); ++i) rows.emplace_back(values.begin() + static_cast<std::ptrdiff_t>(i * vocab), values.begin() + static_cast<std::ptrdiff_t>((i + 1) * vocab));
    return rows;
  })[static_cast<std::size_t>(rt.local_devices().front())];  // every device has them; under MPI only ours is here
}

void check_options(const SampleOptions& o) {
  if (o.tokens < 0) fail("sample", "--tokens must be at least 0, got {}", o.tokens);
  if (!std::isfinite(o.temperature) || o.temperature < 0 || o.temperature > 1000)
    fail("sample", "--temperature must be a finite number in [0, 1000], got {}", o.temperature);
  if (o.top_k < 0) fail("sample", "--top-k must be at least 0 (0: the whole vocabulary), got {}", o.top_k);
  if (static_cast<std::int64_t>(o.seed) < 0) fail("sample", "--seed must be at least 0, got {}", static_cast<std::int64_t>(o.seed));
}

std::string sample(const SampleOptions& o) {
  check_options(o);
  const Loaded m = load_for_inference(o);
  const auto tokens = prompt_tokens(o, m, o.tokens);
  const AxisRules& rules = m.rules;
  Runtime rt = Runtime::from_env(m.mesh, runtime_options(o.backend));
  return rt.run([&](Shard& s) {
    NoGrad no_grad;
    Model model = model_on(s, m);
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
    return text_of(o, generated);
  })[static_cast<std::size_t>(rt.local_devices().front())];  // the same text on every device
}

}  // namespace gptj
