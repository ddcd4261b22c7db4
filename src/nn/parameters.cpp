#include "nax/nn/parameters.h"

#include "nax/autodiff/autodiff.h"
#include "nax/ops/ops.h"

namespace nax::nn {

Parameters Parameters::init(Shard& shard, const std::vector<ParamSpec>& specs, const AxisRules& rules, std::uint64_t seed,
                            DType dtype) {
  Parameters p;
  p.specs_ = specs;
  for (const auto& spec : specs) {
    p.values_.push_back(parameter(spec.init == Init::normal ? shard.random_normal(spec.global, rules, seed, spec.name, spec.stddev, dtype)
                                                            : shard.full(spec.global, rules, spec.init == Init::ones ? 1.0 : 0.0, dtype)));
  }
  return p;
}

Parameters Parameters::from_values(const std::vector<ParamSpec>& specs, std::vector<Tensor> values) {
  if (specs.size() != values.size()) fail("Parameters", "{} values for {} parameter specs", values.size(), specs.size());
  Parameters p;
  p.specs_ = specs;
  for (auto& v : values) p.values_.push_back(parameter(stop_gradient(v)));
  return p;
}

const Tensor& Parameters::operator[](const std::string& name) const {
  for (std::size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return values_[i];
  fail("Parameters", "no parameter named '{}'", name);
}

void Parameters::assign(std::vector<Tensor> values) {
  if (values.size() != values_.size()) fail("Parameters::assign", "{} values for {} parameters", values.size(), values_.size());
  for (std::size_t i = 0; i < values.size(); ++i) assign(i, std::move(values[i]));
}

void Parameters::assign(std::size_t i, Tensor value) {
  if (i >= values_.size()) fail("Parameters::assign", "parameter {} of {}", i, values_.size());
  if (value.shape() != values_[i].shape() || value.vary() != values_[i].vary())
    fail("Parameters::assign", "'{}' is {}, got {}", specs_[i].name, values_[i].str(), value.str());
  values_[i] = parameter(stop_gradient(value));
}

std::int64_t Parameters::global_count() const {
  std::int64_t n = 0;
  for (const auto& s : specs_) n += s.global.numel();
  return n;
}

}  // namespace nax::nn
