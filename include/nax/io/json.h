#pragma once
// The one JSON reader for the files nax is given (model configs, weight indexes, tokenizers,
// manifests, trainer state, safetensors headers, cost models, results read back). A file is read
// only below its kind's size cap (nax/io/caps.h) and parsed through nlohmann-json's SAX interface,
// which keeps its own stack: no recursion depends on the input. The tree it builds is refused as
// soon as it nests deeper or holds more values than the kind allows; a key given twice in an object
// (which parsers otherwise resolve silently), invalid UTF-8, a number beyond a double and text
// after the value are refused too. Every error names the file and the JSON path of the value:
//   tokenizer: 'tok.json': field 'model.vocab["Ġabc"]' is 2147483647, outside [0, 16777215]
// Needs nlohmann-json (Debian's nlohmann-json3-dev), which nax's build uses; nax/nax.h does not
// include this header.
#include <fmt/format.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "nax/core/error.h"
#include "nax/io/caps.h"

namespace nax::io {

// A value of a parsed document, with its file and JSON path ("" at the top, "run.seed",
// "added_tokens[3].id", "weight_map[\"lm_head.bias\"]"). Values keep their document alive.
class JsonValue {
 public:
  struct Source {
    std::string op, file;  // the refusals' prefix ("tokenizer") and the file's path
    nlohmann::json tree;
  };
  JsonValue(std::shared_ptr<const Source> source, const nlohmann::json* value, std::string path)
      : source_(std::move(source)), value_(value), path_(std::move(path)) {}

  const std::string& file() const { return source_->file; }
  const std::string& path() const { return path_; }
  const nlohmann::json& raw() const { return *value_; }

  bool is_null() const { return value_->is_null(); }
  bool is_object() const { return value_->is_object(); }
  bool is_array() const { return value_->is_array(); }
  bool is_string() const { return value_->is_string(); }
  bool is_boolean() const { return value_->is_boolean(); }
  bool is_number() const { return value_->is_number(); }
  // An object's members or an array's elements; another value is refused.
  std::size_t size() const;

  // Member `key` of an object: a value that is not an object, or a missing key, is refused.
  JsonValue at(std::string_view key) const;
  // Member `key` of an object, or nullopt when absent (given(): also when null).
  std::optional<JsonValue> find(std::string_view key) const;
  std::optional<JsonValue> given(std::string_view key) const;
  // Element `index` of an array.
  JsonValue at(std::size_t index) const;
  void for_each_member(const std::function<void(const std::string& key, const JsonValue& value)>& visit) const;
  void for_each_element(const std::function<void(const JsonValue& value)>& visit) const;

  // The value as a type, or a refusal saying what it is instead.
  std::int64_t integer(std::int64_t lo, std::int64_t hi) const;  // an integer in [lo, hi]
  double number(double lo, double hi) const;                     // any number in [lo, hi]
  const std::string& string() const;
  bool boolean() const;

  // The value as JSON for a message, cut at 80 characters.
  std::string brief() const;

  // A nax::Error "OP: 'FILE': field 'PATH' MESSAGE" ("OP: 'FILE' MESSAGE" at the top level).
  [[noreturn]] void refuse(const std::string& message) const;
  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const {
    refuse(fmt::format(format, std::forward<Args>(args)...));
  }

 private:
  JsonValue child(const nlohmann::json& value, std::string path) const { return {source_, &value, std::move(path)}; }
  const nlohmann::json& object() const;

  std::shared_ptr<const Source> source_;
  const nlohmann::json* value_;
  std::string path_;
};

// The document in `text`, which `file` names in errors and `op` prefixes, within `caps`.
JsonValue parse_json(std::string_view text, const std::string& file, const FileCaps& caps, std::string_view op);
// The document in file `path`, read only when it is a regular file within caps.max_bytes.
JsonValue read_json(const std::string& path, const FileCaps& caps, std::string_view op);

// `key` appended to a JSON path: "a.key", or "a[\"k ey\"]" when the key is not an identifier.
std::string json_member_path(const std::string& path, std::string_view key);

}  // namespace nax::io
