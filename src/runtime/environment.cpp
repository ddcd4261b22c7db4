// The one place nax reads its environment variables (the table in docs/architecture.md): into
// the options of each runtime made, where the code left them unset.
#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>

#include "nax/core/error.h"
#include "nax/kernels/sum_tree.h"
#include "nax/runtime/runtime.h"
#include "runtime/runtime_state.h"

namespace nax {

namespace {

// The variable's value, or an empty view when it is unset or empty.
std::string_view variable(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

bool switched_on(const char* name) {
  const std::string_view value = variable(name);
  return !value.empty() && value != "0";
}

double positive_seconds(const char* name, double otherwise) {
  const std::string value(variable(name));
  if (value.empty()) return otherwise;
  char* end = nullptr;
  const double seconds = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0' || !(seconds > 0))
    fail("Runtime", "{}='{}' is not a positive number of seconds", name, value);
  return seconds;
}

std::int64_t max_cut(const char* name, std::int64_t otherwise) {
  const std::string value(variable(name));
  if (value.empty()) return otherwise;
  char* end = nullptr;
  const long long n = std::strtoll(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0' || !is_power_of_two(n))
    fail("Runtime", "{}='{}' is not a power of two number of devices", name, value);
  return n;
}

}  // namespace

namespace detail {

RuntimeOptions with_environment(RuntimeOptions options) {
  if (!(options.collective_timeout_s > 0)) options.collective_timeout_s = positive_seconds("NAX_COLLECTIVE_TIMEOUT_S", 300.0);
  if (!options.check_values) options.check_values = switched_on("NAX_CHECK");
  if (!options.sharding_log) options.sharding_log = switched_on("NAX_SHARDING_LOG");
  if (options.deterministic_max_cut <= 0) options.deterministic_max_cut = max_cut("NAX_DETERMINISTIC_MAX_CUT", SumTree::kMaxCut);
  if (options.blas_threads <= 0) options.blas_threads = std::max(1, std::atoi(std::string(variable("OPENBLAS_NUM_THREADS")).c_str()));
  return options;
}

bool launched_by_mpirun() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"})
    if (!variable(name).empty()) return true;
  return false;
}

std::string_view runtime_choice() { return variable("NAX_RUNTIME"); }

}  // namespace detail
}  // namespace nax
