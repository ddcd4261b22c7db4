#pragma once
// The MoE layer of moe.h as plain f64 loops over host vectors, token by token: an independent
// reference for its forward values (and, through finite differences, its gradients).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "moe.h"

namespace moe {

struct ReferenceResult {
  std::vector<double> y;  // [group, tokens, embed]
  std::int64_t dropped = 0;  // assignments beyond capacity
};

inline double gelu_reference(double v) { return 0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))); }

// x [groups, tokens, embed], router [embed, route], w_in [expert, embed, mlp], w_out [expert, mlp, embed], row-major.
inline ReferenceResult reference_layer(const std::vector<double>& x, std::int64_t groups, std::int64_t tokens,
                                       const std::vector<double>& router, const std::vector<double>& w_in,
                                       const std::vector<double>& w_out, const Config& c) {
  const std::int64_t E = c.experts, D = c.embed, M = c.mlp;
  ReferenceResult out;
  out.y.assign(static_cast<std::size_t>(groups * tokens * D), 0.0);
  auto expert_mlp = [&](std::int64_t e, const double* in, double gate, double* y) {
    for (std::int64_t d = 0; d < D; ++d) {
      double acc = 0;
      for (std::int64_t m = 0; m < M; ++m) {
        double h = 0;
        for (std::int64_t i = 0; i < D; ++i) h += in[i] * w_in[static_cast<std::size_t>((e * D + i) * M + m)];
        acc += gelu_reference(h) * w_out[static_cast<std::size_t>((e * M + m) * D + d)];
      }
      y[d] += gate * acc;
    }
  };
  for (std::int64_t g = 0; g < groups; ++g) {
    std::vector<std::vector<std::int64_t>> choice(static_cast<std::size_t>(tokens));
    std::vector<std::vector<double>> gate(static_cast<std::size_t>(tokens));
    for (std::int64_t t = 0; t < tokens; ++t) {
      const double* in = &x[static_cast<std::size_t>((g * tokens + t) * D)];
      std::vector<double> p(static_cast<std::size_t>(E));
      for (std::int64_t e = 0; e < E; ++e)
        for (std::int64_t i = 0; i < D; ++i) p[static_cast<std::size_t>(e)] += in[i] * router[static_cast<std::size_t>(i * E + e)];
      const double top = *std::max_element(p.begin(), p.end());
      double total = 0;
      for (auto& v : p) total += (v = std::exp(v - top));
      for (auto& v : p) v /= total;
      std::vector<std::int64_t> order(static_cast<std::size_t>(E));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) { return p[static_cast<std::size_t>(a)] > p[static_cast<std::size_t>(b)]; });
      double kept = 0;
      for (std::int64_t j = 0; j < c.k; ++j) {
        choice[static_cast<std::size_t>(t)].push_back(order[static_cast<std::size_t>(j)]);
        kept += p[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])];
      }
      for (std::int64_t j = 0; j < c.k; ++j)
        gate[static_cast<std::size_t>(t)].push_back(p[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])] / (c.k > 1 ? kept : 1.0));
    }
    std::vector<std::int64_t> used(static_cast<std::size_t>(E), 0);
    for (std::int64_t j = 0; j < c.k; ++j)  // every token's first choice before any second choice
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::int64_t e = choice[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)];
        if (used[static_cast<std::size_t>(e)]++ >= c.capacity) {
          ++out.dropped;
          continue;
        }
        const std::size_t at = static_cast<std::size_t>((g * tokens + t) * D);
        expert_mlp(e, &x[at], gate[static_cast<std::size_t>(t)][static_cast<std::size_t>(j)], &out.y[at]);
      }
  }
  return out;
}

}  // namespace moe
