#pragma once
// A run folder of checkpoints that are each one unit: step_NNNNNN/ folders, each written as
// step_NNNNNN.tmp.PID/, its files flushed, a manifest.json (every file's size and checksum)
// written last, then renamed into place and the run folder flushed. A reader only ever sees
// committed step folders; a writer killed at any point leaves at worst a temporary, removed by the
// next writer. One writer at a time: an advisory lock (flock) on RUN/.lock.
#include <cstdint>
#include <string>
#include <vector>

namespace nax::checkpoint {

class RunFolder {
 public:
  // Creates `dir` if needed and locks it, or raises a nax::Error naming the pid of the writer
  // that holds it; removes the temporaries that earlier writers (no longer running) left.
  explicit RunFolder(const std::string& dir);
  RunFolder(RunFolder&&) noexcept;
  RunFolder& operator=(RunFolder&&) = delete;
  ~RunFolder();  // releases the lock

  const std::string& dir() const { return dir_; }
  // A fresh temporary folder for step `step`'s files.
  std::string begin_step(std::int64_t step);
  // Commits the temporary folder of begin_step: manifest, flushes, rename. Then removes all but
  // the newest `keep` committed steps (0: keeps all).
  void commit_step(const std::string& tmp, std::int64_t step, std::int64_t keep = 0);

 private:
  std::string dir_;
  int lock_fd_ = -1;
};

std::string step_folder(const std::string& dir, std::int64_t step);  // DIR/step_000120
// The step of a committed folder's name "step_NNNNNN", or -1 for any other name.
std::int64_t step_of_name(const std::string& name);
// The committed steps in `dir`, oldest first (temporaries and other entries ignored).
std::vector<std::int64_t> committed_steps(const std::string& dir);
// Checks a committed step folder against its manifest: every file listed present, a regular
// file of its size and checksum, no other file; errors name the file.
void verify_step_folder(const std::string& folder);
// Whether `dir` is, or was, a run's step folder, to be read only as a committed one: named
// step_NNNNNN (or a temporary of one), inside a run folder (one holding a writer's .lock or
// committed steps), or holding a manifest.json.
bool looks_like_step_folder(const std::string& dir);

}  // namespace nax::checkpoint
