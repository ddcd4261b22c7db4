// An outside project using an installed nax's MPI component, run under mpirun -np 2: one process
// per device, psum across the processes.
#include <nax/nax.h>

#include <cstdio>

int main() {
  nax::Runtime rt = nax::Runtime::mpi(nax::Mesh::parse("mp=2"));
  auto totals = rt.run([](nax::Shard&) {
    nax::Tensor x = nax::pvary(nax::full(nax::Shape{{"i", 3}}, 1.5), "mp");
    return nax::psum(x, "mp").to_vector<float>();
  });
  for (float v : totals[static_cast<std::size_t>(nax::process_index())])
    if (v != 3.0f) {
      std::printf("process %d: wrong psum result %g\n", nax::process_index(), v);
      return 1;
    }
  std::printf("consumer_mpi: process %d of %d: psum over mp=2 gives 3.0\n", nax::process_index(), nax::process_count());
  return 0;
}
