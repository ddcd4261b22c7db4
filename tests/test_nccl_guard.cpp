// The NCCL communicator's failure handling (comm/nccl_guard.h) on the CPU, through a fake of the
// NCCL calls: a group whose ranks are threads, whose all-gather completes once every rank posted,
// and whose async errors and aborts the tests set and watch.
#include <atomic>
#include <map>
#include <thread>

#include "comm/nccl_guard.h"
#include "helpers.h"

using namespace nax;
using comm::NcclGuard;
using comm::NcclOps;

namespace {

class FakeNcclGroup {
 public:
  explicit FakeNcclGroup(int size) : size_(size), calls_(size), pending_(size, -1), results_(size), errors_(size), aborted_(size) {}

  NcclOps ops(int rank) {
    NcclOps o;
    o.all_gather_words = [this, rank](const std::int64_t* mine, std::size_t words) {
      std::lock_guard lock(mutex_);
      auto& posts = posts_[calls_[rank]];
      posts.resize(static_cast<std::size_t>(size_));
      posts[rank].assign(mine, mine + words);
      pending_[rank] = calls_[rank]++;
      results_[rank].assign(words * static_cast<std::size_t>(size_), 0);
      return results_[rank].data();
    };
    o.idle = [this, rank] {
      std::lock_guard lock(mutex_);
      if (pending_[rank] < 0) return true;
      const auto& posts = posts_[pending_[rank]];
      for (const auto& p : posts)
        if (p.empty()) return false;
      for (std::size_t r = 0; r < posts.size(); ++r) std::copy(posts[r].begin(), posts[r].end(), results_[rank].begin() + r * posts[r].size());
      pending_[rank] = -1;
      return true;
    };
    o.async_error = [this, rank](std::string& message) {
      std::lock_guard lock(mutex_);
      if (errors_[rank].empty()) return NcclOps::Status::ok;
      message = errors_[rank];
      return NcclOps::Status::error;
    };
    o.abort = [this, rank] { aborted_[rank] = true; };
    return o;
  }

  void fail_peer(int rank, std::string message) {  // what ncclCommGetAsyncError reports on `rank`
    std::lock_guard lock(mutex_);
    errors_[rank] = std::move(message);
  }
  bool aborted(int rank) const { return aborted_[rank]; }

 private:
  int size_;
  std::mutex mutex_;
  std::map<int, std::vector<std::vector<std::int64_t>>> posts_;  // call number -> each rank's words
  std::vector<int> calls_, pending_;
  std::vector<std::vector<std::int64_t>> results_;
  std::vector<std::string> errors_;
  std::vector<std::atomic<bool>> aborted_;
};

constexpr std::chrono::duration<double> kShort{0.3};

CollectiveSignature signature(CollectiveKind kind, std::size_t count, const std::string& origin, int detail = 0,
                              std::uint64_t call_site = 0) {
  return CollectiveSignature{kind, DType::f32, count, detail, 0, &origin, call_site};
}

// Runs fn(rank) on one thread per rank; returns each rank's error message ("" when none).
std::vector<std::string> on_ranks(int size, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(static_cast<std::size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const Error& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("nccl guard: equal signatures pass, call after call", "[nccl]") {
  FakeNcclGroup group(3);
  const std::string origin = "psum(f32[i=4], mp)";
  auto errors = on_ranks(3, [&](int r) {
    NcclGuard guard(group.ops(r), "group (mp) of devices [0,1,2]", {0, 1, 2}, r, kShort);
    for (int call = 0; call < 20; ++call) guard.check_signature(signature(CollectiveKind::all_reduce, 4 + call, origin));
  });
  for (const auto& e : errors) REQUIRE(e.empty());
}

TEST_CASE("nccl guard: a mismatched collective is an error naming both calls on every rank", "[nccl]") {
  FakeNcclGroup group(2);
  const std::string psum = "psum(x, mp)", gather = "all_gather(y, mp)";
  auto errors = on_ranks(2, [&](int r) {
    NcclGuard guard(group.ops(r), "group (mp) of devices [4,6]", {4, 6}, r, kShort);
    guard.check_signature(r == 0 ? signature(CollectiveKind::all_reduce, 4, psum) : signature(CollectiveKind::all_gather, 8, gather));
  });
  for (const auto& e : errors) {
    INFO(e);
    REQUIRE(e.find("collective mismatch in group (mp) of devices [4,6]") != std::string::npos);
    REQUIRE(e.find("device 4 called psum(x, mp) [all_reduce(sum, f32 x 4)]") != std::string::npos);
    REQUIRE(e.find("device 6 called all_gather(y, mp) [all_gather(f32 x 8)]") != std::string::npos);
  }
  REQUIRE_FALSE(group.aborted(0));  // a mismatch found by the check leaves the communicator usable
}

TEST_CASE("nccl guard: the same collective from two call sites is a mismatch naming both", "[nccl]") {
  FakeNcclGroup group(2);
  const std::string first = "psum(x, mp) at a.cpp:10:3", second = "psum(x, mp) at a.cpp:12:3";
  auto errors = on_ranks(2, [&](int r) {
    NcclGuard guard(group.ops(r), "group (mp) of devices [0,1]", {0, 1}, r, kShort);
    guard.check_signature(signature(CollectiveKind::all_reduce, 4, r == 0 ? first : second, 0, r == 0 ? 10 : 12));
  });
  for (const auto& e : errors) {
    INFO(e);
    REQUIRE(e.find("collective mismatch") != std::string::npos);
    REQUIRE(e.find("a.cpp:10:3") != std::string::npos);
    REQUIRE(e.find("a.cpp:12:3") != std::string::npos);
  }
}

TEST_CASE("nccl guard: a peer that never joins times out and aborts the communicator", "[nccl]") {
  FakeNcclGroup group(2);
  const std::string origin = "psum(x, dp)";
  NcclGuard guard(group.ops(0), "group (dp) of devices [0,1]", {0, 1}, 0, kShort);
  try {
    guard.check_signature(signature(CollectiveKind::all_reduce, 4, origin));
    FAIL("no error");
  } catch (const Error& e) {
    INFO(e.what());
    REQUIRE(std::string(e.what()).find("did not finish within") != std::string::npos);
    REQUIRE(std::string(e.what()).find("psum(x, dp)") != std::string::npos);
  }
  REQUIRE(group.aborted(0));
  REQUIRE(guard.aborted());
  REQUIRE_THROWS_WITH(guard.check_signature(signature(CollectiveKind::all_reduce, 4, origin)),
                      Catch::Matchers::Contains("aborted by an earlier failure"));
}

TEST_CASE("nccl guard: an async error from a failed peer aborts and names it", "[nccl]") {
  FakeNcclGroup group(2);
  group.fail_peer(0, "remote process exited or there was a network error");
  NcclGuard guard(group.ops(0), "group (dp) of devices [0,1]", {0, 1}, 0, std::chrono::duration<double>(30));
  REQUIRE_THROWS_WITH(guard.wait("all_reduce(sum, f32 x 4)"), Catch::Matchers::Contains("remote process exited") &&
                                                                  Catch::Matchers::Contains("communicator aborted"));
  REQUIRE(group.aborted(0));
}

TEST_CASE("nccl guard: drain_gpu returns only once in-flight work has finished", "[nccl]") {
  FakeNcclGroup group(2);
  NcclOps rank0 = group.ops(0);
  NcclGuard guard(group.ops(0), "group (dp) of devices [0,1]", {0, 1}, 0, std::chrono::duration<double>(30));
  const std::int64_t word = 7;
  rank0.all_gather_words(&word, 1);  // rank 0's half of a collective: in flight until rank 1 joins
  std::atomic<bool> joined = false;
  std::thread peer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    joined = true;
    group.ops(1).all_gather_words(&word, 1);
  });
  NcclGuard::drain_gpu();
  REQUIRE(joined);
  peer.join();
}
