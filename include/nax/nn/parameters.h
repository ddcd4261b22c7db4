#pragma once
// A model's parameters, keyed by global names. Each is initialised from (seed, name, global
// index) and cut by axis rules, so that every mesh holds blocks of the same global model.
#include <cstdint>
#include <string>
#include <vector>

#include "nax/runtime/runtime.h"

namespace nax::nn {

enum class Init { normal, zeros, ones };

struct ParamSpec {
  std::string name;
  Shape global;
  Init init = Init::normal;
  double stddev = 0.02;  // for Init::normal
};

class Parameters {
 public:
  // This device's blocks of every parameter, marked as autodiff parameters.
  static Parameters init(Shard& shard, const std::vector<ParamSpec>& specs, const AxisRules& rules, std::uint64_t seed,
                         DType dtype = DType::f32);

  // Existing blocks (e.g. loaded from a checkpoint), one per spec, made parameters.
  static Parameters from_values(const std::vector<ParamSpec>& specs, std::vector<Tensor> values);

  std::size_t size() const { return values_.size(); }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  const std::vector<Tensor>& values() const { return values_; }
  const Tensor& operator[](const std::string& name) const;
  const Tensor& operator[](std::size_t i) const { return values_[i]; }
  // Replaces every value (e.g. after an optimizer step), keeping them parameters.
  void assign(std::vector<Tensor> values);
  // Replaces value i (its shape and vary type unchanged), keeping it a parameter.
  void assign(std::size_t i, Tensor value);
  std::int64_t global_count() const;  // number of scalars in the global model

 private:
  std::vector<ParamSpec> specs_;
  std::vector<Tensor> values_;
};

}  // namespace nax::nn
