// bench_checkpoint: what committing a checkpoint step costs. Writes a step folder holding one
// safetensors file of --mb MiB (checksummed as it is written) and a small JSON file, commits it
// (manifest, flushes, rename), then verifies it, --reps times. Beside it, in the same run, one more
// checksum pass over the file: what commit saves by listing the checksum the writer took.
//
//   build/bin/bench_checkpoint [--mb 256] [--reps 3] [--dir /tmp/nax_bench_checkpoint]
#include <nax/nax.h>

#include <fmt/format.h>

#include <filesystem>

#include "bench_util.h"

namespace {

struct Options {
  std::int64_t mb = 256;
  int reps = 3;
  std::string dir = "/tmp/nax_bench_checkpoint";
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--mb") o.mb = bench::parse_integer(bench::flag_value(argc, argv, i), arg);
    else if (arg == "--reps") o.reps = static_cast<int>(bench::parse_integer(bench::flag_value(argc, argv, i), arg));
    else if (arg == "--dir") o.dir = bench::flag_value(argc, argv, i);
    else if (arg == "--help") {
      fmt::print("usage: bench_checkpoint [--mb 256] [--reps 3] [--dir DIR]\n");
      std::exit(0);
    } else nax::fail(arg, "unknown flag (try --help)");
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ckpt = nax::checkpoint;
  try {
    const Options o = parse(argc, argv);
    std::filesystem::remove_all(o.dir);
    const nax::Tensor weights = nax::random_normal(nax::Shape{{"n", o.mb * 262144}}, 1, "w", 1.0, nax::DType::f32);
    const double mib = static_cast<double>(o.mb);
    std::vector<double> write_s, commit_s, verify_s, extra_pass_s;
    {
      ckpt::RunFolder run(o.dir);
      for (int rep = 0; rep < o.reps; ++rep) {
        const std::string tmp = run.begin_step(rep);
        write_s.push_back(bench::seconds_of([&] { ckpt::save_safetensors(tmp + "/model.safetensors", {{"w", weights}}); }));
        nax::io::write_file_atomically(tmp + "/trainer.json", "{\"step\": 1}\n");
        commit_s.push_back(bench::seconds_of([&] { run.commit_step(tmp, rep, 1); }));
        const std::string folder = ckpt::step_folder(o.dir, rep);
        verify_s.push_back(bench::seconds_of([&] { ckpt::verify_step_folder(folder); }));
        extra_pass_s.push_back(bench::seconds_of([&] { nax::io::file_checksum(folder + "/model.safetensors"); }));
      }
    }
    std::filesystem::remove_all(o.dir);
    const double write = bench::median(write_s), commit = bench::median(commit_s), verify = bench::median(verify_s),
                 extra = bench::median(extra_pass_s);
    fmt::print("step of {} MiB, median of {}: write (checksummed) {:.3f} s, commit {:.3f} s, save {:.3f} s = {:.0f} MiB/s; verify {:.3f} s\n",
               o.mb, o.reps, write, commit, write + commit, mib / (write + commit), verify);
    fmt::print("one more checksum pass over the file: {:.3f} s ({:.2f}x of a save)\n", extra, (write + commit + extra) / (write + commit));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_checkpoint: {}\n", e.what());
    return 2;
  }
}
