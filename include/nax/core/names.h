#pragma once
// One or several axis names: "embed", {"heads", "head_dim"}, or a std::vector<std::string>.
// (A plain std::string parameter would silently accept {"a", "b"} as an iterator pair.)
#include <initializer_list>
#include <string>
#include <vector>

namespace nax {

class Names {
 public:
  Names(const char* name) : names_{name} {}
  Names(std::string name) : names_{std::move(name)} {}
  Names(std::initializer_list<std::string> names) : names_(names) {}
  Names(std::vector<std::string> names) : names_(std::move(names)) {}

  const std::vector<std::string>& list() const { return names_; }
  operator const std::vector<std::string>&() const { return names_; }
  std::size_t size() const { return names_.size(); }
  std::string str() const;  // "mp" or "(dp, mp)"

 private:
  std::vector<std::string> names_;
};

}  // namespace nax
