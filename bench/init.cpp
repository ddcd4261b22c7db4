// bench_init: initialising a GPT-J model's parameters (every normal-initialised tensor through
// random_normal: vectorised Philox, vectorised f32 normals with an exact fallback, all cores) against
// the scalar generator called per element as random_normal did before (rng::normal, a vector of
// doubles, then a conversion). Both give the same bits; the bench checks that on every tensor.
// Wall-clock seconds, one run each (the 1.3b reference takes about a minute here).
//
//   build/bin/bench_init [--config 1.3b] [--dtype f32|bf16] [--no-reference] [--json FILE]
#include <fmt/format.h>

#include <nax/core/rng.h>
#include <nax/nax.h>

#include <cstring>
#include <thread>

#include "bench_util.h"
#include "config.h"
#include "model.h"

namespace {

nax::Tensor scalar_reference(const nax::nn::ParamSpec& spec, std::uint64_t seed, nax::DType dtype) {
  const nax::rng::Key key = nax::rng::make_key(seed, spec.name);
  std::vector<double> values(static_cast<std::size_t>(spec.global.numel()));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = spec.stddev * nax::rng::normal(key, i);
  return nax::from_vector(spec.global, values, dtype);
}

bool same_bits(const nax::Tensor& a, const nax::Tensor& b) {
  return a.numel() == b.numel() && std::memcmp(a.raw(), b.raw(), static_cast<std::size_t>(a.numel()) * nax::dtype_size(a.dtype())) == 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string config = "1.3b", json_path;
    nax::DType dtype = nax::DType::f32;
    bool reference = true;
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      if (arg == "--config") config = bench::flag_value(argc, argv, i);
      else if (arg == "--dtype") dtype = nax::parse_dtype(bench::flag_value(argc, argv, i));
      else if (arg == "--no-reference") reference = false;
      else if (arg == "--json") json_path = bench::flag_value(argc, argv, i);
      else nax::fail("bench_init", "unknown argument '{}' (usage: bench_init [--config 1.3b] [--dtype f32|bf16] [--no-reference] [--json FILE])", arg);
    }
    const std::uint64_t seed = 1;
    double fast_s = 0, reference_s = 0;
    std::int64_t elements = 0;
    bool identical = true;
    for (const auto& spec : gptj::parameter_specs(gptj::config_by_name(config))) {
      if (spec.init != nax::nn::Init::normal) continue;
      elements += spec.global.numel();
      auto t0 = bench::Clock::now();
      nax::Tensor fast = nax::random_normal(spec.global, seed, spec.name, spec.stddev, dtype);
      fast_s += bench::seconds_between(t0, bench::Clock::now());
      if (!reference) continue;
      t0 = bench::Clock::now();
      nax::Tensor slow = scalar_reference(spec, seed, dtype);
      reference_s += bench::seconds_between(t0, bench::Clock::now());
      identical = identical && same_bits(fast, slow);
    }
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    fmt::print("init {} ({} normal elements, {}, {} cores): {:.2f} s, {:.2f} ns/element\n", config, elements,
               nax::dtype_name(dtype), cores, fast_s, 1e9 * fast_s / static_cast<double>(elements));
    if (reference)
      fmt::print("scalar generator (before): {:.2f} s; speed-up {:.2f}x; identical bits: {}\n", reference_s, reference_s / fast_s,
                 identical ? "yes" : "NO");
    if (!json_path.empty())
      bench::write_text_file(json_path, bench::JsonObject()
                                            .add("config", config)
                                            .add("dtype", std::string(nax::dtype_name(dtype)))
                                            .add("elements", elements)
                                            .add("cores", static_cast<std::int64_t>(cores))
                                            .add("init_s", fast_s)
                                            .add("reference_s", reference_s)
                                            .add("speedup", reference ? reference_s / fast_s : 0.0)
                                            .add("identical", identical)
                                            .str() + "\n");
    return identical ? 0 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
}
