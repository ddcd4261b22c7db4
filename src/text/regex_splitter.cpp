#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex_splitter.h"

#include <pcre2.h>

#include "nax/core/error.h"

namespace nax::text {

RegexSplitter::RegexSplitter(std::string_view pattern, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    fail(where, "invalid pattern at offset {}: {} (pattern {})", offset, reinterpret_cast<const char*>(message), pattern);
  }
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT support, matching is interpreted: slower, same result
  code_ = code;
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void* RegexSplitter::new_match_data() const { return pcre2_match_data_create_from_pattern(static_cast<pcre2_code*>(code_), nullptr); }

void RegexSplitter::free_match_data(void* match_data) { pcre2_match_data_free(static_cast<pcre2_match_data*>(match_data)); }

bool RegexSplitter::find(std::string_view text, std::size_t start, void* match_data, std::size_t& begin, std::size_t& end) const {
  auto* data = static_cast<pcre2_match_data*>(match_data);
  // The text is valid UTF-8 (the tokenizer replaced what was not): no need to check it again.
  const int rc = pcre2_match(static_cast<pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), start,
                             PCRE2_NO_UTF_CHECK, data, nullptr);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(rc, message, sizeof message);
    fail("tokenizer", "pattern match failed: {}", reinterpret_cast<const char*>(message));
  }
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data);
  begin = ovector[0];
  end = ovector[1];
  return true;
}

}  // namespace nax::text
