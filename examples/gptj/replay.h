#pragma once
// A step replayed from its trace: each device's timeline (its compute between collectives, its
// blocking collectives, the collectives it started and where it waited for them), replayed with
// the compute rescaled and every collective priced anew, so that what overlapped in the run
// overlaps in the replay. `gptj compare` projects cluster step times with it (compare.h).
#include <nax/nax.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace gptj {

struct TimelineEvent {
  enum class Kind {
    compute,     // the device computes (ops, and whatever else ran outside collectives) for `seconds`
    collective,  // a blocking collective: the device waits for its group, then for the transfer
    start,       // a started collective: queued on its group's communicator, the device goes on
    wait,        // the device waits for the started collective `ticket`
  };
  Kind kind = Kind::compute;
  // compute: as measured; collective, start: the transfer as measured, its waits for peers left out
  // (-1 for a start whose transfer the trace did not see: only the thread runtime records it)
  double seconds = 0;
  // compute: the device thread's CPU time in it, the work itself without the time it waited for a
  // core (-1: not in the trace; its wall time stands for it)
  double cpu_seconds = -1;
  nax::CollectiveKind collective = nax::CollectiveKind::all_reduce;
  std::size_t bytes = 0;      // as the trace's collective slices count them (the operand)
  std::vector<std::string> mesh_axes;  // the group's, as the collective named them
  std::uint64_t ticket = 0;   // start and wait: which started collective
};
using Timeline = std::vector<TimelineEvent>;

// A compute event's work: its CPU time where the trace has it, else its wall time.
double work_of(const TimelineEvent& e);

// Each device's timeline from a trace's slices: the device's slices inside its window, a step's
// slice on its track, and its transfers track's. A collective over a group of one moves nothing:
// it is compute.
std::vector<Timeline> timelines_of(const std::vector<nax::trace::RecordedSlice>& slices,
                                   const std::vector<nax::trace::RecordedSlice>& windows);

struct ReplayCosts {
  double compute_scale = 1;  // replayed compute seconds per second of work (work_of)
  // Seconds of one collective over the group of `mesh_axes`.
  std::function<double(nax::CollectiveKind kind, std::size_t bytes, const std::vector<std::string>& mesh_axes)> price;
  // How many devices compute at once (0: all): more share the cores equally, each at cores / k of
  // its speed while k compute (simulated devices on fewer cores, as on the machine that ran them).
  int cores = 0;
};

// The busiest device's compute work (work_of), as measured.
double busiest_compute_s(const std::vector<Timeline>& timelines);

// Every device starts at 0; a collective begins when its whole group has reached it and the
// group's earlier collectives are done (a communicator runs its calls in order), and lasts its
// price; a started one runs while its devices go on, until their waits; the devices computing at
// once share `costs.cores`. `mesh` gives the groups (Mesh::group). Returns the step's seconds:
// the last device's end.
double replay(const std::vector<Timeline>& timelines, const nax::Mesh& mesh, const ReplayCosts& costs);

// A link per group of mesh axes (its name: the axes, "dp,mp").
using Links = std::map<std::vector<std::string>, nax::Link>;

// The run's own costs: compute as measured, each collective priced on its group's link in `links`
// at its group's size on `mesh`, the devices sharing `cores` (0: a core each).
ReplayCosts measured_costs(const Links& links, const nax::Mesh& mesh, int cores = 0);

// Fits a link (latency per ring step, bandwidth) per group of mesh axes to the transfers measured
// in the timelines, by least squares on CostModel::seconds' formula; groups with fewer than two
// sizes of transfer get the bandwidth of their mean and no latency.
Links fit_links(const std::vector<Timeline>& timelines, const nax::Mesh& mesh);

}  // namespace gptj
