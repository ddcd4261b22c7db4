#pragma once
// ZeRO-1's layout of the optimizer state (AdamWConfig::shard_state_over): each parameter's local
// block, flattened, is cut into n equal parts (the last padded), one per rank of the mesh axis. A
// rank keeps the moments of its parts only (its segments), updates those elements and all-gathers
// each parameter back from the ranks' parts: one parameter at a time, so that the gather needs
// room for one parameter more, not for a flat copy of them all.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nax/tensor/tensor.h"

namespace nax::nn::detail {

struct Segment {
  std::size_t param = 0;
  std::int64_t start = 0, length = 0;  // elements of the parameter's block, in its axis order
};

class ZeroLayout {
 public:
  // The layout of `like` (parameters, or moments shaped as them) over mesh axis `axis` of the
  // current shard's mesh (an error naming the mesh when it has no such axis).
  ZeroLayout(const std::vector<Tensor>& like, std::string axis);

  const std::vector<Segment>& segments() const { return segments_; }
  // Refuses `values` unless they are shaped, typed and cut as the layout's parameters.
  void check_matches(const std::vector<Tensor>& values, const char* op) const;
  // One segment of `value` (a parameter, its gradient or a moment, in the parameter's axis order).
  Tensor cut(const Tensor& value, const Segment& segment) const;
  // Every rank's segments, one per segments() entry here, gathered over the axis into whole
  // parameters (shapes and vary types of the layout's). A collective over the axis; a rank with no
  // segment of a (small) parameter sends padding.
  std::vector<Tensor> gather(const std::vector<Tensor>& segment_values) const;

 private:
  std::string axis_;
  int ranks_ = 1;
  DType dtype_;
  std::shared_ptr<Device> device_;
  std::vector<Shape> shapes_;
  std::vector<VaryType> varies_;
  std::vector<std::int64_t> parts_;    // elements per rank of each parameter
  std::vector<Segment> segments_;
  std::vector<std::ptrdiff_t> segment_of_;  // of each parameter, -1 where this rank has none
};

}  // namespace nax::nn::detail
