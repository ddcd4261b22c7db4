// An outside project using an installed nax: psum over a 2-device mesh.
#include <nax/nax.h>

#include <cstdio>

int main() {
  nax::Runtime rt = nax::Runtime::local(nax::Mesh::parse("mp=2"));
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
  std::printf("consumer: psum over mp=2 gives 3.0 on every device\n");
  return 0;
}
