#include "comm/mpi/mpi_control.h"

#include <fmt/format.h>

#include <iterator>
#include <sstream>
#include <utility>

#include "nax/core/error.h"

namespace nax::mpi {

namespace {
constexpr int kTag = 1;
constexpr char kAbort = 'A', kEnded = 'E';
}  // namespace

Control::Control(MPI_Comm world, int device, int devices) : device_(device), devices_(devices) {
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_dup(world, &comm), "MPI_Comm_dup");
  comm_ = CommHandle(comm);
}

Control::~Control() {
  // Sends still in flight (to a peer that never polled again) are let go.
  if (!active()) return;
  reap_sends();
  for (auto& out : outgoing_) {
    for (MPI_Request& r : out.requests)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    static_cast<void>(out.text.release());  // deliberately leaked: MPI may still read it
  }
  if (!outgoing_.empty()) comm_.abandon();
}

void Control::send(std::string message) {
  reap_sends();
  Outgoing& out = outgoing_.emplace_back();
  out.text = std::make_unique<std::string>(std::move(message));
  for (int d = 0; d < devices_; ++d) {
    if (d == device_) continue;
    MPI_Request& r = out.requests.emplace_back();
    check(MPI_Isend(out.text->data(), static_cast<int>(out.text->size()), MPI_CHAR, d, kTag, comm_.get(), &r), "MPI_Isend");
  }
}

void Control::reap_sends() {
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    int done = 0;
    check(MPI_Testall(static_cast<int>(it->requests.size()), it->requests.data(), &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    it = done != 0 ? outgoing_.erase(it) : std::next(it);
  }
}

void Control::send_abort(const std::string& reason) { send(fmt::format("{}{}\n{}", kAbort, epoch_, reason)); }

void Control::send_ended(const Ended& ended) {
  std::string text = fmt::format("{}{}\n{}\n{}\n", kEnded, epoch_, static_cast<int>(ended.end), ended.left_pending ? 1 : 0);
  for (const auto& [key, calls] : ended.calls) text += fmt::format("{}={}\n", key, calls);
  if (!ended.reason.empty()) text += "!" + ended.reason;  // last: it may hold newlines
  send(std::move(text));
}

void Control::poll() {
  reap_sends();
  while (true) {
    int arrived = 0;
    MPI_Status status;
    check(MPI_Iprobe(MPI_ANY_SOURCE, kTag, comm_.get(), &arrived, &status), "MPI_Iprobe");
    if (arrived == 0) return;
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    std::string message(static_cast<std::size_t>(length), '\0');
    check(MPI_Recv(message.data(), length, MPI_CHAR, status.MPI_SOURCE, kTag, comm_.get(), MPI_STATUS_IGNORE), "MPI_Recv");
    receive(message, status.MPI_SOURCE);
  }
}

void Control::receive(const std::string& message, int source) {
  std::istringstream in(message.substr(1));
  std::uint64_t epoch = 0;
  in >> epoch;
  in.ignore(1);  // the newline
  if (epoch > epoch_) {
    later_.emplace_back(message, source);
    return;
  }
  if (epoch < epoch_) return;  // cannot happen: every run ends with every device's ended message
  if (message[0] == kAbort) {
    std::string reason(std::istreambuf_iterator<char>(in), {});
    if (abort_reason_.empty()) abort_reason_ = std::move(reason);
    return;
  }
  int end = 0, pending = 0;
  in >> end >> pending;
  Ended e{static_cast<RunEnd>(end), pending != 0, {}};
  std::string line;
  while (std::getline(in, line)) {
    if (line.starts_with('!')) {
      e.reason = line.substr(1);
      for (std::string more; std::getline(in, more);) e.reason += "\n" + more;
      break;
    }
    const auto eq = line.rfind('=');
    if (eq != std::string::npos) e.calls[line.substr(0, eq)] = std::stoull(line.substr(eq + 1));
  }
  ended_[source] = std::move(e);
}

void Control::begin_run(std::uint64_t epoch) {
  epoch_ = epoch;
  abort_reason_.clear();
  ended_.clear();
  auto waiting = std::exchange(later_, {});
  for (const auto& [message, source] : waiting) receive(message, source);
}

}  // namespace nax::mpi
