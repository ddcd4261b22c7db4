#pragma once
// A thread that runs one communicator's started collectives, in the order they were started, so
// that the device's own thread computes meanwhile. Made on the first start; joined on destruction.
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "nax/comm/communicator.h"

namespace nax::local {

class CommWorker {
 public:
  CommWorker() = default;
  ~CommWorker();
  CommWorker(const CommWorker&) = delete;
  CommWorker& operator=(const CommWorker&) = delete;

  // Queues `task`; the request's wait() returns when it has run (raising what it raised).
  std::unique_ptr<Communicator::Request> submit(std::function<void()> task);
  // Waits until every task queued so far has run (their errors go to their requests).
  void drain();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  // What a task raised, carried to the waiting thread as text and raised there afresh (an
  // exception object shared between threads is freed by whichever lets go last, which TSan cannot
  // follow through libstdc++).
  struct Outcome {
    enum class Kind { ok, error, aborted } kind = Kind::ok;
    std::string message;
  };
  class WorkerRequest;
  std::deque<std::packaged_task<Outcome()>> queue_;
  bool busy_ = false, stopping_ = false;
  std::thread thread_;
};

}  // namespace nax::local
