#include "comm/local/comm_worker.h"

#include "comm/local/local_world.h"

#include <utility>

namespace nax::local {

class CommWorker::WorkerRequest final : public Communicator::Request {
 public:
  explicit WorkerRequest(std::future<Outcome> done) : done_(std::move(done)) {}
  ~WorkerRequest() override {
    if (done_.valid()) done_.wait();  // the buffers must outlive the collective
  }
  void wait() override {
    if (!done_.valid()) return;
    const Outcome outcome = done_.get();
    if (outcome.kind == Outcome::Kind::aborted) throw Aborted(outcome.message);
    if (outcome.kind == Outcome::Kind::error) throw Error(outcome.message);
  }

 private:
  std::future<Outcome> done_;
};

CommWorker::~CommWorker() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::unique_ptr<Communicator::Request> CommWorker::submit(std::function<void()> task) {
  std::packaged_task<Outcome()> packaged([task = std::move(task)] {
    try {
      task();
    } catch (const Aborted& e) {
      return Outcome{Outcome::Kind::aborted, e.what()};
    } catch (const std::exception& e) {
      return Outcome{Outcome::Kind::error, e.what()};
    }
    return Outcome{};
  });
  auto done = packaged.get_future();
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(packaged));
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();
  return std::make_unique<WorkerRequest>(std::move(done));
}

void CommWorker::drain() {
  std::unique_lock lock(mutex_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void CommWorker::loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    std::packaged_task<Outcome()> task = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    task();
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace nax::local
