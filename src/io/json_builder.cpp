#include "io/json_builder.h"

#include <fmt/format.h>

#include "nax/io/json.h"

namespace nax::io {

nlohmann::json* JsonBuilder::put(nlohmann::json value) {
  if (++values_ > caps_.max_values) {
    stop(fmt::format(" holds more than {} JSON values, the cap for a {} (at '{}')", caps_.max_values, caps_.kind, where()));
    return nullptr;
  }
  if (open_.empty()) {
    root_ = std::move(value);
    return &root_;
  }
  nlohmann::json& top = *open_.back().node;
  if (top.is_array()) {
    top.push_back(std::move(value));
    return &top.back();
  }
  *slot_ = std::move(value);
  return slot_;
}

bool JsonBuilder::open(nlohmann::json container) {
  if (open_.size() >= caps_.max_depth)
    return stop(fmt::format(": the JSON nests deeper than {} levels, the cap for a {} (at '{}')", caps_.max_depth, caps_.kind, where()));
  nlohmann::json* node = put(std::move(container));
  if (node == nullptr) return false;
  open_.push_back({node, {}});
  return true;
}

bool JsonBuilder::close() {
  open_.pop_back();
  return true;
}

bool JsonBuilder::key(string_t& key) {
  Frame& top = open_.back();
  top.key = key;
  if (top.node->contains(key))
    return stop(fmt::format(": field '{}' is given twice (a JSON parser would keep one of them silently)", where()));
  slot_ = &(*top.node)[key];
  return true;
}

bool JsonBuilder::parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) {
  std::string_view what = e.what();
  if (const auto at = what.find("] "); what.starts_with("[json.exception.") && at != std::string_view::npos) what.remove_prefix(at + 2);
  const std::string path = where();
  return stop(fmt::format(" is not valid JSON (byte {}{}): {}", position, path.empty() ? "" : fmt::format(", in '{}'", path), what));
}

bool JsonBuilder::stop(std::string error) {
  if (error_.empty()) error_ = std::move(error);
  return false;
}

std::string JsonBuilder::where() const {
  std::string path;
  for (const Frame& f : open_) {
    if (f.node->is_array()) path += fmt::format("[{}]", f.node->empty() ? 0 : f.node->size() - 1);
    else if (!f.key.empty() || f.node->size() > 0) path = json_member_path(path, f.key);
  }
  return path;
}

}  // namespace nax::io
