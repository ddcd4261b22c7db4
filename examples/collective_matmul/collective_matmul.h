#pragma once
// All-gather matmul as a ppermute ring (the "collective matmul" of Wang et al., ASPLOS 2023):
// y = all_gather(x, m, rows) · w, where each of the n devices of mesh axis m holds a block of x's
// rows. Instead of gathering every block and then multiplying, each device multiplies the block
// it holds while that block travels on to the next device: n steps, each a start_ppermute
// overlapped with one dot, so that the transfer hides behind the compute. The gradients need no
// code here: the backward of a started ppermute is a started ppermute the other way, waited where
// the forward started it.
#include <nax/nax.h>

#include <string>
#include <vector>

namespace collective_matmul {

// The ring r -> r + 1 over n ranks.
inline std::vector<std::pair<int, int>> ring(int n) {
  std::vector<std::pair<int, int>> pairs;
  for (int r = 0; r < n; ++r) pairs.push_back({r, (r + 1) % n});
  return pairs;
}

// dot(all_gather(x, mesh_axis, rows), w, contract), overlapped. x: this device's block of rows
// (Varying over mesh_axis); w: whatever dot accepts beside it.
inline nax::Tensor overlapped(const nax::Tensor& x, const nax::Tensor& w, const std::string& mesh_axis, const std::string& rows,
                              const std::string& contract) {
  const int n = nax::axis_size(mesh_axis);
  const int r = static_cast<int>(nax::axis_index(mesh_axis).item());
  std::vector<nax::Tensor> blocks(static_cast<std::size_t>(n));
  nax::Tensor held = x;  // at step i, the rows of device r - i
  for (int i = 0; i < n; ++i) {
    nax::Pending<nax::Tensor> next;
    if (i + 1 < n) next = nax::start_ppermute(held, mesh_axis, ring(n));
    blocks[static_cast<std::size_t>((r - i + n) % n)] = nax::dot(held, w, contract);
    if (i + 1 < n) held = next.wait();
  }
  return nax::concat(blocks, rows);
}

// The same product, gathering first.
inline nax::Tensor blocking(const nax::Tensor& x, const nax::Tensor& w, const std::string& mesh_axis, const std::string& rows,
                            const std::string& contract) {
  return nax::dot(nax::all_gather(x, mesh_axis, rows), w, contract);
}

}  // namespace collective_matmul
