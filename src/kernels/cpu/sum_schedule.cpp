#include "kernels/cpu/sum_schedule.h"

namespace nax::cpu {

namespace {

void add_node(std::int64_t begin, std::int64_t n, const SumTree& tree, SumSchedule& out) {
  if (tree.halves(n)) {
    add_node(begin, n / 2, tree.half(), out);
    add_node(begin + n / 2, n / 2, tree.half(), out);
    ++out.leaves.back().merges;
  } else {
    out.leaves.push_back({begin, n, 0});
  }
}

}  // namespace

SumSchedule sum_schedule(std::int64_t n, const SumTree& tree) {
  SumSchedule out;
  if (n <= 0) return out;
  add_node(0, n, tree, out);
  int top = 0;
  for (const SumLeaf& l : out.leaves) {
    out.depth = std::max(out.depth, top + 1);
    top += 1 - l.merges;
  }
  return out;
}

}  // namespace nax::cpu
