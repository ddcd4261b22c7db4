// An outside project using an installed nax, CPU only: psum over a 2-device mesh, and the errors
// a program gets for the backends it does not link.
#include <nax/nax.h>

#include <cstdio>
#include <string>

namespace {

// Whether `make` raises a nax::Error whose message contains `expected`.
template <typename F>
bool raises(F make, const std::string& expected) {
  try {
    make();
  } catch (const nax::Error& e) {
    if (std::string(e.what()).find(expected) != std::string::npos) return true;
    std::printf("unexpected error: %s\n", e.what());
    return false;
  }
  std::printf("no error, expected one containing '%s'\n", expected.c_str());
  return false;
}

}  // namespace

int main() {
  const nax::Mesh mesh = nax::Mesh::parse("mp=2");
  nax::Runtime rt = nax::Runtime::local(mesh);
  auto totals = rt.run([](nax::Shard&) {
    nax::Tensor x = nax::pvary(nax::full(nax::Shape{{"i", 3}}, 1.5), "mp");
    return nax::psum(x, "mp").to_vector<float>();
  });
  for (const auto& t : totals)
    for (float v : t)
      if (v != 3.0f) {
        std::printf("wrong psum result %g\n", v);
        return 1;
      }
  if (!raises([&] { nax::Runtime::mpi(mesh); }, NAX_HAS_MPI ? "link nax::mpi" : "built without MPI")) return 1;
  if (!raises([&] { nax::Runtime::local(mesh, {.backend = nax::Backend::cuda}); },
              NAX_HAS_CUDA ? "link nax::cuda" : "built without the CUDA backend"))
    return 1;
  std::printf("consumer: psum over mp=2 gives 3.0 on every device; unlinked backends say which target to link\n");
  return 0;
}
