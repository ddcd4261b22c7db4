// Reading a Hugging Face tokenizer.json through nax's bounded JSON reader: only what a byte-level
// BPE (GPT-2, GPT-J) uses is accepted; anything that would change the ids and that nax does not
// implement is refused by name, and so are ids that would not make a table of the vocabulary.
#include <unordered_map>

#include "nax/core/error.h"
#include "nax/io/json.h"
#include "text/byte_level.h"
#include "text/tokenizer_impl.h"

namespace nax::text {
namespace {

using io::JsonValue;

std::string type_of(const JsonValue& part) {
  if (!part.is_object()) part.fail("is {}, not an object", part.brief());
  return part.at("type").string();
}

bool flag(const JsonValue& object, std::string_view name, bool fallback) {
  const auto value = object.given(name);
  return value ? value->boolean() : fallback;
}

// A field that must be null, absent or empty for the ids to be right.
void require_absent(const JsonValue& object, std::string_view name, const std::string& why) {
  const auto value = object.given(name);
  if (!value || (value->is_string() && value->string().empty())) return;
  value->fail("is {}, which is not supported ({})", value->brief(), why);
}

std::int32_t token_id(const JsonValue& id) { return static_cast<std::int32_t>(id.integer(0, io::kMaxTokenIds - 1)); }

// Every id of the file and where it was given, to find two tokens with one id and the largest id.
struct Ids {
  std::unordered_map<std::int32_t, std::string> token_of;
  std::int32_t largest = -1;
  std::string largest_path;
};

void read_pre_tokenizer(const JsonValue& root, BpeTokenizer::Impl& t, const std::string& where) {
  const JsonValue pre = root.at("pre_tokenizer");
  if (const std::string type = type_of(pre); type != "ByteLevel") pre.at("type").fail("is '{}', which is not supported (expected ByteLevel, as GPT-2's)", type);
  t.add_prefix_space = flag(pre, "add_prefix_space", true);
  if (flag(pre, "use_regex", true)) t.splitter = std::make_unique<RegexSplitter>(gpt2_pattern, where + " (pre_tokenizer)");
}

void check_other_parts(const JsonValue& root) {
  if (const auto normalizer = root.given("normalizer"))
    normalizer->at("type").fail("is '{}', which is not supported (expected null, as GPT-2's)", type_of(*normalizer));
  if (const auto post = root.given("post_processor"); post && type_of(*post) != "ByteLevel")
    post->at("type").fail("is '{}', which is not supported (expected null or ByteLevel)", type_of(*post));
  const JsonValue decoder = root.at("decoder");
  if (type_of(decoder) != "ByteLevel") decoder.at("type").fail("is '{}', which is not supported (expected ByteLevel)", type_of(decoder));
  require_absent(root, "truncation", "encode would truncate: remove it and truncate the ids");
  require_absent(root, "padding", "encode would pad: remove it and pad the ids");
}

std::vector<std::pair<std::string, std::string>> read_merges(const JsonValue& merges) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  merges.for_each_element([&](const JsonValue& m) {
    if (m.is_string()) {  // "left right" (tokenizers before 0.20)
      const std::string& s = m.string();
      const auto space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) m.fail("is {}, not \"left right\"", m.brief());
      out.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m.at(std::size_t{0}).is_string() && m.at(std::size_t{1}).is_string()) {  // ["left", "right"]
      out.emplace_back(m.at(std::size_t{0}).string(), m.at(std::size_t{1}).string());
    } else {
      m.fail("is {}, not \"left right\" or [\"left\", \"right\"]", m.brief());
    }
  });
  return out;
}

void read_vocab(const JsonValue& vocab, BpeTokenizer::Impl& t, Ids& ids) {
  if (!vocab.is_object()) vocab.fail("is {}, not an object of token: id", vocab.brief());
  t.model_ids.reserve(vocab.size());
  vocab.for_each_member([&](const std::string& token, const JsonValue& value) {
    const std::int32_t id = token_id(value);
    if (const auto [it, fresh] = ids.token_of.emplace(id, token); !fresh) value.fail("is {}, the id of token \"{}\" too", id, it->second);
    if (id > ids.largest) ids.largest = id, ids.largest_path = value.path();
    t.model_ids.emplace(token, id);
  });
}

void read_model(const JsonValue& root, BpeTokenizer::Impl& t, Ids& ids, const std::string& where) {
  const JsonValue model = root.at("model");
  if (!model.is_object()) model.fail("is {}, not an object", model.brief());
  if (const auto type = model.find("type"); type && (!type->is_string() || type->string() != "BPE"))
    type->fail("is {}, which is not supported (expected \"BPE\")", type->brief());
  require_absent(model, "dropout", "dropout makes encoding random");
  require_absent(model, "continuing_subword_prefix", "byte-level BPE has none");
  require_absent(model, "end_of_word_suffix", "byte-level BPE has none");
  if (flag(model, "byte_fallback", false)) model.at("byte_fallback").fail("is true, which is not supported (byte-level BPE needs none)");
  read_vocab(model.at("vocab"), t, ids);
  BpeModel::Options options;
  options.fuse_unk = flag(model, "fuse_unk", false);
  options.ignore_merges = flag(model, "ignore_merges", false);
  if (const auto unk = model.given("unk_token")) {
    auto it = t.model_ids.find(unk->string());
    if (it == t.model_ids.end()) unk->fail("is \"{}\", which is not in model.vocab", unk->string());
    options.unk_id = it->second;
  }
  t.model = std::make_unique<BpeModel>(t.model_ids, read_merges(model.at("merges")), options, where);
}

// Added tokens are matched in the text before anything else: a few hundred of a few dozen bytes
// each in real tokenizers (GPT-J's 143 <|extratoken_N|>).
constexpr std::size_t kMaxAddedTokenBytes = 256, kMaxAddedTokensBytes = 1 << 20;

void read_added_tokens(const JsonValue& root, BpeTokenizer::Impl& t, Ids& ids) {
  const auto added = root.given("added_tokens");
  if (!added) return;
  std::size_t added_bytes = 0;
  added->for_each_element([&](const JsonValue& a) {
    if (!a.is_object()) a.fail("is {}, not an object", a.brief());
    const JsonValue id_value = a.at("id"), content = a.at("content");
    const std::int32_t id = token_id(id_value);
    if (content.string().empty()) content.fail("is empty");
    if (content.string().size() > kMaxAddedTokenBytes) content.fail("has {} bytes, more than the {} an added token may have", content.string().size(), kMaxAddedTokenBytes);
    if ((added_bytes += content.string().size()) > kMaxAddedTokensBytes)
      content.fail("brings the added tokens to more than {} bytes, the cap for all of them", kMaxAddedTokensBytes);
    for (const char* option : {"single_word", "lstrip", "rstrip"})
      if (flag(a, option, false)) a.at(option).fail("is true, which is not supported");
    // An added token may restate a vocabulary token (GPT-2's <|endoftext|>), not take its id.
    if (const auto [it, fresh] = ids.token_of.emplace(id, content.string()); !fresh && it->second != content.string())
      id_value.fail("is {}, the id of token \"{}\" too", id, it->second);
    if (id > ids.largest) ids.largest = id, ids.largest_path = id_value.path();
    t.added.push_back({content.string(), id, flag(a, "special", false), flag(a, "normalized", true)});
  });
}

// The id table is as long as the largest id: a file whose ids are mostly holes is refused before
// it is made (an id of 2^24 - 1 among a thousand tokens would ask for 16 M entries).
void check_dense(const Ids& ids, const std::string& file) {
  const auto count = static_cast<std::int64_t>(ids.token_of.size()), limit = 2 * count + 1024;
  if (ids.largest >= limit)
    fail("tokenizer", "'{}': field '{}' is {}, but the file has only {} tokens: ids are expected below {} (twice the tokens, plus 1024)", file,
         ids.largest_path, ids.largest, count, limit);
}

// Id tables (added tokens over the model's) and the matchers.
void index_tokens(BpeTokenizer::Impl& t, std::int32_t largest) {
  const auto size = static_cast<std::size_t>(largest + 1);
  t.tokens.assign(size, "");
  t.has_token.assign(size, false);
  t.special.assign(size, false);
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
  const JsonValue root = io::parse_json(text, source, io::kTokenizerCaps, "tokenizer");
  if (!root.is_object()) root.fail("is {}, not a JSON object", root.brief());
  const std::string where = fmt::format("tokenizer: '{}'", source);
  auto t = std::make_shared<BpeTokenizer::Impl>();
  t->source = source;
  Ids ids;
  read_model(root, *t, ids, where);
  read_pre_tokenizer(root, *t, where);
  check_other_parts(root);
  read_added_tokens(root, *t, ids);
  check_dense(ids, source);
  index_tokens(*t, ids.largest);
  return t;
}

}  // namespace nax::text
