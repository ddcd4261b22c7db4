// Reading a Hugging Face tokenizer.json: only what a byte-level BPE (GPT-2, GPT-J) uses is
// accepted; anything that would change the ids and that nax does not implement is refused by name.
#include <nlohmann/json.hpp>

#include "nax/core/error.h"
#include "text/byte_level.h"
#include "text/tokenizer_impl.h"

namespace nax::text {
namespace {

using nlohmann::json;

struct Reader {
  std::string where;  // "tokenizer FILE"

  [[noreturn]] void refuse(const std::string& field, const std::string& why) const { fail(where, "field '{}': {}", field, why); }

  const json& member(const json& object, const std::string& name, const std::string& field) const {
    auto it = object.find(name);
    if (it == object.end()) refuse(field, "missing");
    return *it;
  }
  std::string type_of(const json& part, const std::string& field) const {
    if (!part.is_object()) refuse(field, "expected an object");
    auto it = part.find("type");
    if (it == part.end() || !it->is_string()) refuse(field + ".type", "missing");
    return it->get<std::string>();
  }
  bool flag(const json& object, const std::string& name, const std::string& field, bool fallback) const {
    auto it = object.find(name);
    if (it == object.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) refuse(field + "." + name, "expected true or false");
    return it->get<bool>();
  }
  // A field that must be null, absent or one of `allowed` (strings) for the ids to be right.
  void require_absent(const json& object, const std::string& name, const std::string& field, const std::string& why) const {
    auto it = object.find(name);
    if (it == object.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty())) return;
    refuse(field.empty() ? name : field + "." + name, fmt::format("{} is not supported ({})", it->dump(), why));
  }
};

void read_pre_tokenizer(const Reader& r, const json& root, BpeTokenizer::Impl& t) {
  const json& pre = r.member(root, "pre_tokenizer", "pre_tokenizer");
  const std::string type = r.type_of(pre, "pre_tokenizer");
  if (type != "ByteLevel") r.refuse("pre_tokenizer.type", fmt::format("'{}' is not supported (expected ByteLevel, as GPT-2's)", type));
  t.add_prefix_space = r.flag(pre, "add_prefix_space", "pre_tokenizer", true);
  if (r.flag(pre, "use_regex", "pre_tokenizer", true)) t.splitter = std::make_unique<RegexSplitter>(gpt2_pattern, r.where + " (pre_tokenizer)");
}

void check_other_parts(const Reader& r, const json& root) {
  if (auto it = root.find("normalizer"); it != root.end() && !it->is_null()) {
    r.refuse("normalizer.type", fmt::format("'{}' is not supported (expected null, as GPT-2's)", r.type_of(*it, "normalizer")));
  }
  if (auto it = root.find("post_processor"); it != root.end() && !it->is_null()) {
    const std::string type = r.type_of(*it, "post_processor");
    if (type != "ByteLevel") r.refuse("post_processor.type", fmt::format("'{}' is not supported (expected null or ByteLevel)", type));
  }
  const json& decoder = r.member(root, "decoder", "decoder");
  const std::string type = r.type_of(decoder, "decoder");
  if (type != "ByteLevel") r.refuse("decoder.type", fmt::format("'{}' is not supported (expected ByteLevel)", type));
  r.require_absent(root, "truncation", "", "encode would truncate: remove it and truncate the ids");
  r.require_absent(root, "padding", "", "encode would pad: remove it and pad the ids");
}

std::vector<std::pair<std::string, std::string>> read_merges(const Reader& r, const json& merges) {
  if (!merges.is_array()) r.refuse("model.merges", "expected an array");
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (std::size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    const std::string field = fmt::format("model.merges[{}]", i);
    if (m.is_string()) {  // "left right" (tokenizers before 0.20)
      const std::string s = m.get<std::string>();
      const auto space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) r.refuse(field, "expected \"left right\"");
      out.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["left", "right"]
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      r.refuse(field, "expected \"left right\" or [\"left\", \"right\"]");
    }
  }
  return out;
}

void read_model(const Reader& r, const json& root, BpeTokenizer::Impl& t) {
  const json& model = r.member(root, "model", "model");
  if (!model.is_object()) r.refuse("model", "expected an object");
  if (auto it = model.find("type"); it != model.end() && (!it->is_string() || it->get<std::string>() != "BPE")) {
    r.refuse("model.type", fmt::format("{} is not supported (expected \"BPE\")", it->dump()));
  }
  r.require_absent(model, "dropout", "model", "dropout makes encoding random");
  r.require_absent(model, "continuing_subword_prefix", "model", "byte-level BPE has none");
  r.require_absent(model, "end_of_word_suffix", "model", "byte-level BPE has none");
  if (r.flag(model, "byte_fallback", "model", false)) r.refuse("model.byte_fallback", "true is not supported (byte-level BPE needs none)");
  const json& vocab = r.member(model, "vocab", "model.vocab");
  if (!vocab.is_object()) r.refuse("model.vocab", "expected an object of token: id");
  for (const auto& [token, id] : vocab.items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > INT32_MAX) {
      r.refuse("model.vocab", fmt::format("id of token \"{}\" is {}, expected an integer in [0, 2^31)", token, id.dump()));
    }
    t.model_ids.emplace(token, id.get<std::int32_t>());
  }
  BpeModel::Options options;
  options.fuse_unk = r.flag(model, "fuse_unk", "model", false);
  options.ignore_merges = r.flag(model, "ignore_merges", "model", false);
  if (auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) r.refuse("model.unk_token", "expected a string or null");
    auto unk = t.model_ids.find(it->get<std::string>());
    if (unk == t.model_ids.end()) r.refuse("model.unk_token", fmt::format("\"{}\" is not in model.vocab", it->get<std::string>()));
    options.unk_id = unk->second;
  }
  t.model = std::make_unique<BpeModel>(t.model_ids, read_merges(r, r.member(model, "merges", "model.merges")), options, r.where);
}

void read_added_tokens(const Reader& r, const json& root, BpeTokenizer::Impl& t) {
  auto it = root.find("added_tokens");
  if (it == root.end() || it->is_null()) return;
  if (!it->is_array()) r.refuse("added_tokens", "expected an array");
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& a = (*it)[i];
    const std::string field = fmt::format("added_tokens[{}]", i);
    if (!a.is_object()) r.refuse(field, "expected an object");
    const json& id = r.member(a, "id", field + ".id");
    const json& content = r.member(a, "content", field + ".content");
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > INT32_MAX) r.refuse(field + ".id", "expected an integer in [0, 2^31)");
    if (!content.is_string() || content.get<std::string>().empty()) r.refuse(field + ".content", "expected a non-empty string");
    for (const char* option : {"single_word", "lstrip", "rstrip"}) {
      if (r.flag(a, option, field, false)) r.refuse(field + "." + option, "true is not supported");
    }
    AddedToken token{content.get<std::string>(), id.get<std::int32_t>(), r.flag(a, "special", field, false), r.flag(a, "normalized", field, true)};
    t.added.push_back(std::move(token));
  }
}

// Id tables (added tokens over the model's) and the matchers.
void index_tokens(BpeTokenizer::Impl& t) {
  std::int64_t size = 0;
  for (const auto& [token, id] : t.model_ids) size = std::max<std::int64_t>(size, id + 1);
  for (const auto& a : t.added) size = std::max<std::int64_t>(size, a.id + 1);
  t.tokens.assign(static_cast<std::size_t>(size), "");
  t.has_token.assign(static_cast<std::size_t>(size), false);
  t.special.assign(static_cast<std::size_t>(size), false);
  for (const auto& [token, id] : t.model_ids) {
    t.tokens[static_cast<std::size_t>(id)] = token;
    t.has_token[static_cast<std::size_t>(id)] = true;
  }
  std::vector<const AddedToken*> raw, normalized;
  for (const auto& a : t.added) {
    t.tokens[static_cast<std::size_t>(a.id)] = a.content;
    t.has_token[static_cast<std::size_t>(a.id)] = true;
    t.special[static_cast<std::size_t>(a.id)] = a.special;
    t.added_ids[a.content] = a.id;
    (a.normalized ? normalized : raw).push_back(&a);
  }
  // As `tokenizers`' ByteLevel decoder: a token whose characters are not all byte-level ones (an
  // added token such as "<|ü|>") stands for its own UTF-8 bytes.
  t.bytes.resize(t.tokens.size());
  for (std::size_t id = 0; id < t.tokens.size(); ++id) t.bytes[id] = byte_level().bytes_of(t.tokens[id]).value_or(t.tokens[id]);
  t.raw_matcher = std::make_unique<AddedTokenMatcher>(raw);
  t.normalized_matcher = std::make_unique<AddedTokenMatcher>(normalized);
}

}  // namespace

std::shared_ptr<BpeTokenizer::Impl> parse_tokenizer_json(std::string_view text, const std::string& source) {
  Reader r{fmt::format("tokenizer {}", source)};
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    fail(r.where, "not valid JSON: {}", e.what());
  }
  if (!root.is_object()) fail(r.where, "not a JSON object");
  auto t = std::make_shared<BpeTokenizer::Impl>();
  t->source = source;
  try {
    read_model(r, root, *t);
    read_pre_tokenizer(r, root, *t);
    check_other_parts(r, root);
    read_added_tokens(r, root, *t);
  } catch (const json::exception& e) {
    fail(r.where, "unexpected JSON: {}", e.what());
  }
  index_tokens(*t);
  return t;
}

}  // namespace nax::text
