// Generation with a KV cache, on any mesh, from a checkpoint saved on any mesh.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "checkpoint.h"
#include "train.h"

#include <nax/io/read_file.h>
#include <nax/text/bpe_tokenizer.h>

namespace gptj {

using namespace nax;

namespace {

// Picks the next token among the first `ids` logits (the tokenizer's ids: a vocabulary padded
// beyond them, as GPT-J's 50400 rows for 50257 tokens, never yields a padding row): temperature,
// then top-k, then top-p, then a draw from stream `key`.
std::int32_t choose(const std::vector<double>& logits, std::size_t ids, const SampleOptions& o, const rng::Key& key, std::uint64_t draw) {
  std::vector<std::int32_t> order(std::min(ids, logits.size()));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](auto a, auto b) { return logits[static_cast<std::size_t>(a)] > logits[static_cast<std::size_t>(b)]; });
  if (o.temperature <= 0) return order[0];
  std::size_t k = o.top_k > 0 ? std::min<std::size_t>(static_cast<std::size_t>(o.top_k), order.size()) : order.size();
  std::vector<double> weights(k);
  const double top = logits[static_cast<std::size_t>(order[0])];
  for (std::size_t i = 0; i < k; ++i) weights[i] = std::exp((logits[static_cast<std::size_t>(order[i])] - top) / o.temperature);
  if (o.top_p < 1) {  // the smallest prefix of the sorted tokens holding top_p of the probability
    const double total = std::accumulate(weights.begin(), weights.end(), 0.0);
    double mass = 0;
    std::size_t keep = 0;
    while (keep < k && mass < o.top_p * total) mass += weights[keep++];
    k = std::max<std::size_t>(keep, 1);
    weights.resize(k);
  }
  double u = rng::uniform(key, draw) * std::accumulate(weights.begin(), weights.end(), 0.0);
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
  std::optional<nax::text::BpeTokenizer> tokenizer;  // read once; none: bytes
};

Loaded load_for_inference(const SampleOptions& o) {
  if (o.ckpt_dir.empty()) fail("sample", "--ckpt DIR is required");
  const Mesh mesh = model_mesh(o.mesh);
  Loaded m{open_model(o.ckpt_dir, nonfinite_policy(o.allow_nonfinite)), {}, mesh, {}, {}};
  check_host_memory("sample", fmt::format("the model in '{}' ({} parameters, f32)", m.files.folder, parameter_count(m.files.config)),
                    4.0 * static_cast<double>(parameter_count(m.files.config)));
  check_fits(m.files.config, m.mesh, m.mesh.axis_size("dp"));
  check_dp_mp_only(m.mesh, "generation");
  m.specs = parameter_specs(m.files.config);
  m.rules = axis_rules(m.mesh);
  m.rules.set("batch", {});  // one sequence, the same on every data-parallel replica
  if (!o.tokenizer.empty()) m.tokenizer = nax::text::BpeTokenizer::from_file(o.tokenizer);
  return m;
}

Model model_on(Shard& s, const Loaded& m) {
  return Model(m.files.config, nn::Parameters::from_values(m.specs, checkpoint::load_sharded(s, m.files.weights, model_reads(m.specs), m.rules, DType::f32)));
}

// The ids the tokenizer (or bytes) can produce, at most the model's vocabulary.
std::size_t token_ids(const Loaded& m) {
  const auto rows = static_cast<std::size_t>(m.files.config.vocab);
  return m.tokenizer ? static_cast<std::size_t>(m.tokenizer->vocab_size()) : std::min<std::size_t>(256, rows);
}

std::vector<std::int32_t> prompt_tokens(const SampleOptions& o, const std::string& prompt_text, const Loaded& m, std::int64_t generated) {
  const Config& c = m.files.config;
  std::vector<std::int32_t> tokens;
  if (!m.tokenizer) {
    tokens = encode(prompt_text.empty() ? std::string("\n") : prompt_text);
  } else {
    const auto& tokenizer = *m.tokenizer;
    if (tokenizer.vocab_size() > c.vocab) fail("sample", "tokenizer {} has {} ids, more than the model's vocabulary {}", o.tokenizer, tokenizer.vocab_size(), c.vocab);
    tokens = tokenizer.encode(prompt_text);
    if (tokens.empty()) tokens.push_back(tokenizer.token_to_id("<|endoftext|>").value_or(0));
  }
  for (std::size_t i = 0; i < tokens.size(); ++i)  // bytes above a small vocabulary (a tokenizer's ids were checked above)
    if (tokens[i] >= c.vocab)
      fail("sample", "the prompt's token {} is id {}, beyond the model's {} rows{}", i, tokens[i], c.vocab, m.tokenizer ? "" : " (give its --tokenizer)");
  const auto context = c.max_seq, prompt = static_cast<std::int64_t>(tokens.size());
  if (prompt > context || generated > context - prompt)  // subtracted, so that no sum overflows
    fail("sample", "the prompt ({} tokens) plus {} generated exceeds the model's context of {} tokens", prompt, generated, context);
  return tokens;
}

std::string text_of(const Loaded& m, const std::vector<std::int32_t>& tokens) { return m.tokenizer ? m.tokenizer->decode(tokens) : decode(tokens); }

}  // namespace

std::vector<std::vector<double>> prompt_logits(const SampleOptions& o) {
  const Loaded m = load_for_inference(o);
  const auto tokens = prompt_tokens(o, o.prompt, m, 0);
  Runtime rt = Runtime::from_env(m.mesh, runtime_options(o.backend, o.deterministic));
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
  if (!std::isfinite(o.top_p) || o.top_p <= 0 || o.top_p > 1) fail("sample", "--top-p must be a number in (0, 1], got {}", o.top_p);
  if (static_cast<std::int64_t>(o.seed) < 0) fail("sample", "--seed must be at least 0, got {}", static_cast<std::int64_t>(o.seed));
  if (o.prompts.size() > 4096) fail("sample", "{} prompts, more than the 4096 one run samples", o.prompts.size());
}

std::vector<std::string> read_prompts(const std::string& path) {
  const std::string text = io::read_file(path, io::kPromptsCaps);
  std::vector<std::string> prompts;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (!line.empty()) prompts.push_back(line);
    begin = end + 1;
  }
  if (prompts.empty()) fail("sample", "--prompts '{}' holds no prompt (one per line)", path);
  return prompts;
}

std::vector<std::string> sample_batch(const SampleOptions& o) {
  check_options(o);
  const Loaded m = load_for_inference(o);
  const std::vector<std::string> prompts = o.prompts.empty() ? std::vector<std::string>{o.prompt} : o.prompts;
  std::vector<std::vector<std::int32_t>> inputs;
  for (const auto& p : prompts) inputs.push_back(prompt_tokens(o, p, m, o.tokens));  // all checked before any work
  const std::size_t ids = token_ids(m);
  const bool stop = o.stop_at_eos && !o.tokenizer.empty();
  const auto eos = static_cast<std::int32_t>(m.files.config.eos_token_id);
  const AxisRules& rules = m.rules;
  Runtime rt = Runtime::from_env(m.mesh, runtime_options(o.backend, o.deterministic));
  return rt.run([&](Shard& s) {
    NoGrad no_grad;
    Model model = model_on(s, m);
    std::vector<std::string> texts;
    for (std::size_t k = 0; k < inputs.size(); ++k) {
      const rng::Key key = rng::make_key(o.seed, k == 0 ? std::string("sample") : fmt::format("sample.{}", k));
      std::vector<KVCache> caches;
      Tensor input = from_vector(Shape{{"batch", 1}, {"seq", static_cast<std::int64_t>(inputs[k].size())}}, inputs[k]);
      std::vector<std::int32_t> generated;
      for (std::int64_t i = 0; i < o.tokens; ++i) {
        Tensor logits = model.logits(s.shard(input, rules), &caches);
        const std::int64_t last = logits.shape().size("seq") - 1;
        Tensor next = all_gather_invariant(slice(logits, "seq", last, last + 1), "mp", "vocab");
        const std::int32_t token = choose(next.to_vector<double>(), ids, o, key, static_cast<std::uint64_t>(i));
        if (stop && token == eos) break;  // every device draws the same token, so all stop together
        generated.push_back(token);
        input = from_vector(Shape{{"batch", 1}, {"seq", 1}}, std::vector<std::int32_t>{token});
      }
      texts.push_back(text_of(m, generated));
    }
    return texts;
  })[static_cast<std::size_t>(rt.local_devices().front())];  // the same texts on every device
}

std::string sample(const SampleOptions& o) {
  SampleOptions one = o;
  one.prompts.clear();
  return sample_batch(one).front();
}

}  // namespace gptj
