#pragma once
// The SAX handler under nax::io::parse_json: builds the nlohmann::json tree with an explicit stack
// of open containers, refusing (by stopping the parse) a tree deeper or larger than the caps and a
// key given twice in an object. The parser (nlohmann's sax_parse) is iterative too.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "nax/io/caps.h"

namespace nax::io {

class JsonBuilder : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit JsonBuilder(const FileCaps& caps) : caps_(caps) {}

  bool null() override { return put(nullptr) != nullptr; }
  bool boolean(bool v) override { return put(v) != nullptr; }
  bool number_integer(number_integer_t v) override { return put(v) != nullptr; }
  bool number_unsigned(number_unsigned_t v) override { return put(v) != nullptr; }
  bool number_float(number_float_t v, const string_t&) override { return put(v) != nullptr; }
  bool string(string_t& v) override { return put(std::move(v)) != nullptr; }
  bool binary(binary_t&) override { return stop(" holds binary data, which JSON text cannot"); }
  bool start_object(std::size_t) override { return open(nlohmann::json::object()); }
  bool key(string_t& key) override;
  bool end_object() override { return close(); }
  bool start_array(std::size_t) override { return open(nlohmann::json::array()); }
  bool end_array() override { return close(); }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& e) override;

  // After a parse that failed: what to append to the file's name in the refusal.
  const std::string& error() const { return error_; }
  nlohmann::json take() { return std::move(root_); }

 private:
  struct Frame {
    nlohmann::json* node;
    std::string key;  // an object's member being read
  };
  nlohmann::json* put(nlohmann::json value);
  bool open(nlohmann::json container);
  bool close();
  bool stop(std::string error);
  std::string where() const;  // the JSON path being read

  FileCaps caps_;
  nlohmann::json root_;
  std::vector<Frame> open_;     // the containers not yet closed, outermost first
  nlohmann::json* slot_ = nullptr;  // where an object's next member value goes
  std::size_t values_ = 0;
  std::string error_;
};

}  // namespace nax::io
