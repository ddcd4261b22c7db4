#include "nax/io/json.h"

#include <cctype>

#include "io/json_builder.h"
#include "nax/io/read_file.h"

namespace nax::io {

namespace {

bool identifier(std::string_view key) {
  if (key.empty() || std::isdigit(static_cast<unsigned char>(key[0]))) return false;
  for (char c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  return true;
}

std::string kind_of(const nlohmann::json& v) {
  if (v.is_object()) return "an object";
  if (v.is_array()) return "an array";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  return "a number";
}

}  // namespace

std::string json_member_path(const std::string& path, std::string_view key) {
  if (identifier(key)) return path.empty() ? std::string(key) : path + "." + std::string(key);
  return path + nlohmann::json(std::string(key)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).insert(0, "[") + "]";
}

std::size_t JsonValue::size() const {
  if (!value_->is_object() && !value_->is_array()) fail("is {}, not an object or an array", brief());
  return value_->size();
}

const nlohmann::json& JsonValue::object() const {
  if (!value_->is_object()) fail("is {}, not an object", brief());
  return *value_;
}

JsonValue JsonValue::at(std::string_view key) const {
  auto found = find(key);
  if (!found) child(*value_, json_member_path(path_, key)).refuse("is missing");
  return *found;
}

std::optional<JsonValue> JsonValue::find(std::string_view key) const {
  const nlohmann::json& o = object();
  auto it = o.find(key);
  if (it == o.end()) return std::nullopt;
  return child(*it, json_member_path(path_, key));
}

std::optional<JsonValue> JsonValue::given(std::string_view key) const {
  auto found = find(key);
  if (found && found->is_null()) return std::nullopt;
  return found;
}

JsonValue JsonValue::at(std::size_t index) const {
  if (!value_->is_array()) fail("is {}, not an array", brief());
  if (index >= value_->size()) fail("has {} elements, none at index {}", value_->size(), index);
  return child((*value_)[index], fmt::format("{}[{}]", path_, index));
}

void JsonValue::for_each_member(const std::function<void(const std::string&, const JsonValue&)>& visit) const {
  for (const auto& [key, value] : object().items()) visit(key, child(value, json_member_path(path_, key)));
}

void JsonValue::for_each_element(const std::function<void(const JsonValue&)>& visit) const {
  if (!value_->is_array()) fail("is {}, not an array", brief());
  for (std::size_t i = 0; i < value_->size(); ++i) visit(child((*value_)[i], fmt::format("{}[{}]", path_, i)));
}

std::int64_t JsonValue::integer(std::int64_t lo, std::int64_t hi) const {
  if (!value_->is_number_integer()) fail("is {}, not an integer", brief());
  bool inside = false;
  if (value_->is_number_unsigned()) {  // the parser's type for every non-negative integer, up to 2^64 - 1
    const auto u = value_->get<std::uint64_t>();
    inside = hi >= 0 && u <= static_cast<std::uint64_t>(hi) && (lo <= 0 || u >= static_cast<std::uint64_t>(lo));
  } else {
    const auto v = value_->get<std::int64_t>();
    inside = v >= lo && v <= hi;
  }
  if (!inside) fail("is {}, outside [{}, {}]", brief(), lo, hi);
  return value_->get<std::int64_t>();
}

double JsonValue::number(double lo, double hi) const {
  if (!value_->is_number()) fail("is {}, not a number", brief());
  const double v = value_->get<double>();
  if (!(v >= lo && v <= hi)) fail("is {}, outside [{}, {}]", brief(), lo, hi);
  return v;
}

const std::string& JsonValue::string() const {
  if (!value_->is_string()) fail("is {}, not a string", brief());
  return value_->get_ref<const std::string&>();
}

bool JsonValue::boolean() const {
  if (!value_->is_boolean()) fail("is {}, not true or false", brief());
  return value_->get<bool>();
}

std::string JsonValue::brief() const {
  std::string text = value_->is_object() || value_->is_array() ? kind_of(*value_)
                                                               : value_->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

void JsonValue::refuse(const std::string& message) const {
  if (path_.empty()) nax::fail(source_->op, "'{}' {}", source_->file, message);
  nax::fail(source_->op, "'{}': field '{}' {}", source_->file, path_, message);
}

JsonValue parse_json(std::string_view text, const std::string& file, const FileCaps& caps, std::string_view op) {
  if (text.size() > caps.max_bytes) nax::fail(op, "'{}' has {} bytes, over the cap of {} for a {}", file, text.size(), format_bytes(caps.max_bytes), caps.kind);
  JsonBuilder builder(caps);
  if (!nlohmann::json::sax_parse(text.begin(), text.end(), &builder, nlohmann::json::input_format_t::json, true, false))
    nax::fail(op, "'{}'{}", file, builder.error());
  auto source = std::make_shared<JsonValue::Source>(JsonValue::Source{std::string(op), file, builder.take()});
  const nlohmann::json* root = &source->tree;
  return JsonValue(std::move(source), root, "");
}

JsonValue read_json(const std::string& path, const FileCaps& caps, std::string_view op) {
  std::string text;
  try {
    text = read_file(path, caps);
  } catch (const Error& e) {
    std::string_view message = e.what();
    if (message.starts_with("read_file: ")) message.remove_prefix(11);  // `op` names the reader instead
    nax::fail(op, "{}", message);
  }
  return parse_json(text, path, caps, op);
}

}  // namespace nax::io
