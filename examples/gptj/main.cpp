// gptj: train and sample a GPT-J-style model written per shard with nax, on a simulated mesh.
//
//   gptj train --config small --mesh dp=2,mp=2 --data FILE... --steps N [...]
//   gptj sample --ckpt DIR --prompt TEXT --tokens N [...]
//   gptj export --config tiny --mesh dp=1,mp=2 --data FILE... --steps K --out DIR [...]
//   gptj tokenize --tokenizer tokenizer.json --text TEXT
//   gptj plan --config 6b --mesh dp=1,mp=8 --batch B --seq 2048 [--remat] [--dtype bf16] [--zero] [--sequence-parallel]
//   gptj convert --ckpt DIR --out HF_DIR [--dtype f16] [--max-file-mb N]
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <nax/io/output_path.h>
#include <nlohmann/json.hpp>

#include "compare.h"
#include "export.h"
#include "hf_export.h"
#include "learner.h"
#include "plan.h"
#include "tokenize.h"
#include "train.h"

namespace {

using Handler = std::function<void(const std::string&)>;

// Flags of one subcommand: each consumes the following argument, except the switches (which take
// none and are handed "1"); unknown flags are errors.
void parse_flags(int argc, char** argv, int first, const std::map<std::string, Handler>& flags, const std::function<void()>& help,
                 const std::map<std::string, Handler>& switches = {}) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      help();
      std::exit(0);
    }
    if (auto sw = switches.find(arg); sw != switches.end()) {
      sw->second("1");
      continue;
    }
    auto it = flags.find(arg);
    if (it == flags.end()) nax::fail("gptj", "unknown flag '{}' (try --help)", arg);
    if (i + 1 >= argc) nax::fail("gptj", "flag {} needs a value", arg);
    it->second(argv[++i]);
  }
}

// `v` as a whole number (std::stoll) or number (std::stod), or an error naming the flag.
template <typename T>
T parse_value(const std::string& flag, const std::string& v, const char* what, T (*parse)(const std::string&, std::size_t*)) {
  std::size_t used = 0;
  T x{};
  try {
    x = parse(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) nax::fail("gptj", "{} expects {}, got '{}'", flag, what, v);
  return x;
}

long long stoll_base10(const std::string& v, std::size_t* used) { return std::stoll(v, used); }
double stod_plain(const std::string& v, std::size_t* used) { return std::stod(v, used); }

std::int64_t to_int(const std::string& flag, const std::string& v) { return parse_value<long long>(flag, v, "an integer", stoll_base10); }
double to_double(const std::string& flag, const std::string& v) {
  const double x = parse_value<double>(flag, v, "a number", stod_plain);
  if (!std::isfinite(x)) nax::fail("gptj", "{} expects a finite number, got '{}'", flag, v);
  return x;
}


// Handlers that store a flag's value in a field.
Handler set(std::string& field) {
  return [&field](const std::string& v) { field = v; };
}
template <typename T>
Handler set_int(const char* flag, T& field) {
  return [flag, &field](const std::string& v) { field = static_cast<T>(to_int(flag, v)); };
}
Handler set_double(const char* flag, double& field) {
  return [flag, &field](const std::string& v) { field = to_double(flag, v); };
}
Handler set_true(bool& field) {
  return [&field](const std::string&) { field = true; };
}

// --trace FILE: records the command's timeline and writes it at the end (nax/trace/trace.h; under mpirun
// one file per process, FILE.rank<r>.json). The path is checked before the work; a trace that
// cannot be written at the end fails the command.
class TraceFile {
 public:
  Handler flag() {
    return [this](const std::string& v) { path_ = v; };
  }
  void start() {
    if (path_.empty()) return;
    nax::io::check_writable(nax::trace::process_path(path_), "--trace");
    nax::trace::start();
  }
  void finish() {
    if (path_.empty() || finished_) return;
    finished_ = true;
    nax::trace::stop();
    nax::trace::write(path_, "gptj");
    fmt::print(stderr, "trace: {} spans written to {}\n", nax::trace::event_count(), nax::trace::process_path(path_));
  }
  ~TraceFile() {  // a command that failed still leaves its timeline, if it can (the exit is already non-zero)
    if (path_.empty() || finished_ || !nax::trace::enabled()) return;
    try {
      finish();
    } catch (const std::exception& e) {
      fmt::print(stderr, "error: {}\n", e.what());
    }
  }

 private:
  std::string path_;
  bool finished_ = false;
};

// The flags that say what to train on, shared by train, compare and export.
std::map<std::string, Handler> run_flags(gptj::TrainOptions& o, std::map<std::string, Handler> more) {
  std::map<std::string, Handler> flags{
      {"--config", set(o.config)},
      {"--backend", [&o](const std::string& v) { o.backend = nax::parse_backend(v); }},
      {"--mesh", set(o.mesh)},
      {"--data", [&o](const std::string& v) { o.data.push_back(v); }},
      {"--steps", set_int("--steps", o.steps)},
      {"--batch", set_int("--batch", o.batch)},
      {"--seq", set_int("--seq", o.seq)},
      {"--lr", set_double("--lr", o.lr)},
      {"--warmup", set_int("--warmup", o.warmup)},
      {"--seed", set_int("--seed", o.seed)},
      {"--overlap-pieces", set_int("--overlap-pieces", o.overlap_pieces)}};
  flags.merge(more);
  return flags;
}

void train_help() {
  fmt::print(
      "usage: gptj train [flags]\n"
      "Trains a GPT-J-style model written per shard on a simulated device mesh (threads), or\n"
      "under mpirun -np <devices> on one process per device.\n\n"
      "  --config NAME      tiny | small | 125m | 350m | 1.3b | 6b      (default small)\n"
      "  --mesh SPEC        mesh axes dp, mp, pp, cp and fsdp in any order, e.g. dp=2,mp=2,\n"
      "                     dp=2,pp=2, mp=2,cp=2 or fsdp=4 (an axis left out has size 1), at most 256\n"
      "                     devices; pp: the layers in pipeline stages; cp: context parallelism,\n"
      "                     ring attention over the sequence in zigzag chunks; fsdp: data parallel\n"
      "                     with the parameters cut over it too             (default dp=2,mp=2)\n"
      "  --backend B        cpu: simulated devices (threads); cuda: device d on GPU d % GPUs,\n"
      "                     NCCL when each device has a GPU, else virtual devices (default cpu)\n"
      "  --sharding MODE    hand: the model written per shard; auto: the same model in the global\n"
      "                     view, sharded by propagation from the axis rules (default hand)\n"
      "  --dtype D          f32, or bf16: mixed precision, bf16 parameters and activations in\n"
      "                     the model, f32 master weights, AdamW state and loss (default f32)\n"
      "  --data FILE        a text file to train on (repeat for several)  (required)\n"
      "  --steps N          optimizer steps                               (default 200)\n"
      "  --batch B          global batch, cut over dp and fsdp            (default 8)\n"
      "  --seq T            tokens per sequence                           (default 128)\n"
      "  --lr X             peak learning rate (warmup, cosine decay)     (default 3e-3)\n"
      "  --warmup N         warmup steps                                  (default 20)\n"
      "  --seed S           init and data seed                            (default 0)\n"
      "  --micro-batches M  gradient accumulation over M micro-batches; with pp, what the\n"
      "                     pipeline's stages pass along (best at least pp)   (default 1)\n"
      "  --schedule S       with pp: 1f1b (each stage one forward ahead per later stage, then a\n"
      "                     backward per forward) or gpipe (every forward, then every backward)\n"
      "                                                                   (default 1f1b)\n"
      "  --ckpt-dir DIR     write checkpoints there, DIR/step_NNNNNN/ (at the end, or every\n"
      "                     --save-every steps); a new run needs an empty or new folder\n"
      "  --save-every N     checkpoint period in steps                    (default 0: at the end)\n"
      "  --keep K           keep the newest K checkpoints                 (default 0: all)\n"
      "  --stop-after N     stop (and checkpoint) after step N, as if interrupted\n"
      "  --resume           continue from the newest checkpoint in --ckpt-dir; the run's settings\n"
      "                     must match the checkpoint's (the mesh may change)\n"
      "  --allow-extend-steps  with --resume: a larger --steps, the cosine schedule stretched over it\n"
      "  --eval-every K     held-out loss every K steps                   (default 50)\n"
      "  --metrics FILE     one JSON object per step (step, loss, tokens_per_s, mfu, ...)\n"
      "  --tokenizer FILE   a Hugging Face tokenizer.json (byte-level BPE) instead of bytes; the text\n"
      "                     is tokenized once into FILE.tokens (docs/tokenizer.md)\n"
      "  --token-cache DIR  where those token files go                  (default: beside the data)\n"
      "  --init-from DIR    fine-tune: start from a Hugging Face GPT-J folder (config.json and\n"
      "                     model.safetensors or shards with model.safetensors.index.json) or a\n"
      "                     nax step folder; its config replaces --config (docs/hf-import.md)\n"
      "  --remat            activation checkpointing per block: keep only each block's input and\n"
      "                     recompute its forward in backward (less memory, one more forward)\n"
      "  --zero             ZeRO-1: each dp rank keeps and updates 1/dp of the AdamW moments, then\n"
      "                     all-gathers the parameters (same steps; checkpoints as without)\n"
      "  --bucket-mb MB     the gradients' sums over dp go in buckets of MB, each started as soon as\n"
      "                     the backward has made it, as PyTorch DDP's; 0: one sum at the end (default 25)\n"
      "  --sequence-parallel  Megatron-style sequence parallelism: between blocks the activations are\n"
      "                     cut along seq over mp (LayerNorms and residuals on 1/mp of the positions,\n"
      "                     reduce-scatter and all-gather instead of the psums); seq divisible by mp;\n"
      "                     with --sharding auto, placements that propagation completes (same steps;\n"
      "                     checkpoints as without)\n"
      "  --overlap-pieces N with --sequence-parallel: each block's batch in N pieces, each piece's\n"
      "                     all-gather and reduce-scatter run while another piece computes (default\n"
      "                     2; 1: the block whole; deterministic mode runs it whole)\n"
      "  --deterministic    bitwise-identical results on every mesh (docs/determinism.md): every\n"
      "                     sum in a canonical order fixed by the global problem; slower; cp runs\n"
      "                     as sequence parallelism over cp (contiguous blocks, heads cut over cp)\n"
      "  --allow-nonfinite  with --init-from or --resume: load weights holding NaN or infinities\n"
      "                     (refused otherwise); a non-finite loss still stops the run\n"
      "  --trace FILE       write a timeline of every device's ops and collectives (Chrome trace JSON,\n"
      "                     for Perfetto and scripts/trace_breakdown.py; one file per rank under mpirun)\n"
      "  --quiet            no progress line (on a terminal a live line, else a plain line per second at most)\n");
}

void sample_help() {
  fmt::print(
      "usage: gptj sample --ckpt DIR [flags]\n"
      "Generates text from a checkpoint, on any mesh, with a KV cache.\n\n"
      "  --ckpt DIR         a run folder of gptj train (its newest checkpoint), a step folder or a\n"
      "                     Hugging Face GPT-J folder (docs/hf-import.md)\n"
      "  --mesh SPEC        e.g. dp=1,mp=2                                (default dp=1,mp=1)\n"
      "  --backend B        cpu or cuda, as for gptj train                (default cpu)\n"
      "  --prompt TEXT      the text to continue; repeat for a batch of prompts (then one JSON\n"
      "                     line {{\"prompt\", \"text\"}} per prompt)\n"
      "  --prompts FILE     a batch of prompts, one per line (empty lines skipped)\n"
      "  --tokens N         tokens to generate                            (default 100)\n"
      "  --temperature X    0 picks the most likely token                 (default 0.8)\n"
      "  --top-k K          sample among the K most likely tokens         (default 40)\n"
      "  --top-p P          then among the most likely tokens holding P of the probability,\n"
      "                     in (0, 1]                                     (default 1)\n"
      "  --ignore-eos       with --tokenizer: do not stop at the config's eos_token_id\n"
      "  --deterministic    bitwise-identical results on every mesh (docs/determinism.md): every\n"
      "                     sum in a canonical order fixed by the global problem; slower\n"
      "  --seed S           sampling seed                                 (default 0)\n"
      "  --tokenizer FILE   the tokenizer.json the model was trained with (default: bytes)\n"
      "  --allow-nonfinite  load weights holding NaN or infinities (refused otherwise)\n"
      "  --trace FILE       write a timeline of the devices' ops and collectives (as for gptj train)\n");
}

int run_train(int argc, char** argv) {
  gptj::TrainOptions o;
  TraceFile trace;
  parse_flags(argc, argv, 2,
              run_flags(o, {{"--trace", trace.flag()},
                            {"--micro-batches", set_int("--micro-batches", o.micro_batches)},
                            {"--schedule", set(o.schedule)},
                            {"--ckpt-dir", set(o.ckpt_dir)},
                            {"--save-every", set_int("--save-every", o.save_every)},
                            {"--keep", set_int("--keep", o.keep)},
                            {"--stop-after", set_int("--stop-after", o.stop_after)},
                            {"--eval-every", set_int("--eval-every", o.eval_every)},
                            {"--metrics", set(o.metrics)},
                            {"--sharding", set(o.sharding)},
                            {"--dtype", [&](const std::string& v) { o.dtype = gptj::parse_compute_dtype(v); }},
                            {"--tokenizer", set(o.tokenizer)},
                            {"--init-from", set(o.init_from)},
                            {"--token-cache", set(o.token_cache)},
                            {"--bucket-mb", set_double("--bucket-mb", o.bucket_mb)}}),
              train_help,
              {{"--resume", set_true(o.resume)},
               {"--allow-extend-steps", set_true(o.allow_extend_steps)},
               {"--remat", set_true(o.remat)},
               {"--zero", set_true(o.zero)},
               {"--sequence-parallel", set_true(o.sequence_parallel)},
               {"--deterministic", set_true(o.deterministic)},
               {"--allow-nonfinite", set_true(o.allow_nonfinite)},
               {"--quiet", set_true(o.quiet)}});
  if (!o.init_from.empty() && std::any_of(argv + 2, argv + argc, [](const char* a) { return std::string_view(a) == "--config"; }))
    nax::fail("gptj", "--config and --init-from: the config comes from '{}/config.json', give one of them", o.init_from);
  gptj::check_options(o);  // before the data is read
  trace.start();
  auto result = gptj::train(o, o.tokenizer.empty() ? gptj::TextData::load(o.data)
                                                   : gptj::TextData::load_tokenized(o.data, o.tokenizer, o.token_cache, o.quiet));
  trace.finish();
  if (nax::process_index() != 0) return 0;  // under mpirun, process 0 reports
  if (!o.init_from.empty() && !o.resume) fmt::print("pretrained model's held-out loss: {:.4f}\n", result.initial_heldout_loss);
  fmt::print("final: train loss {:.4f}, held-out loss {:.4f}, {:.0f} tokens/s, MFU {:.1f}% of {:.0f} GFLOP/s, {} compute\n",
             result.losses.empty() ? 0.0 : result.losses.back(), result.heldout_loss, result.tokens_per_s, 100 * result.mfu,
             result.peak_gflops, nax::dtype_name(o.dtype));
  std::vector<std::string> comm;
  for (const auto& [axes, bytes] : result.bytes_per_step) comm.push_back(fmt::format("{} {:.2f} MB", axes, bytes * 1e-6));
  fmt::print("communication per step and device: {} collectives; {}\n", result.collectives_per_step, fmt::join(comm, ", "));
  fmt::print("memory: peak {:.1f} MB in use on device 0 (nax's allocator, over the run)\n", static_cast<double>(result.peak_bytes) * 1e-6);
  if (result.in_flight > 0)
    fmt::print("pipeline: {} over {} micro-batches, bubble {:.1f}% of stage-ticks idle (device 0 idle {:.1f}% of the schedule), at "
               "most {} micro-batches held by a stage\n", o.schedule, o.micro_batches, 100 * result.bubble, 100 * result.measured_bubble,
               result.in_flight);
  return 0;
}

void export_help() {
  fmt::print(
      "usage: gptj export --out DIR [flags]\n"
      "Writes what an external baseline (bench/jax_baseline.py) needs to train the same run as gptj train:\n"
      "DIR/model.safetensors (the initial parameters), config.json, batches.safetensors (i32 ids.K, targets.K\n"
      "[batch, seq] of steps K = 0..steps-1) and export.json (dims, mesh, seed, optimizer settings).\n\n"
      "  --out DIR          the folder to write                           (required)\n"
      "  --config NAME      tiny | small | 125m | 350m | 1.3b | 6b      (default small)\n"
      "  --mesh SPEC        the mesh gptj train will use (pads the vocab) (default dp=2,mp=2)\n"
      "  --data FILE        a text file to train on (repeat for several)  (required)\n"
      "  --steps N          batches written; the LR schedule's total     (default 200)\n"
      "  --batch B          global batch                                  (default 8)\n"
      "  --seq T            tokens per sequence                           (default 128)\n"
      "  --lr X             peak learning rate                            (default 3e-3)\n"
      "  --warmup N         warmup steps                                  (default 20)\n"
      "  --seed S           init and data seed                            (default 0)\n");
}

void compare_help() {
  fmt::print(
      "usage: gptj compare [flags]\n"
      "Trains the hand-coded (per-shard) GPT-J and the same model in the global view (automatic sharding) on\n"
      "the same config, mesh, data and steps, their steps interleaved, and prints tokens/s, bytes and\n"
      "collectives per step per device and mesh axis, peak memory, losses, a pipeline's bubble, and\n"
      "projected step times on declared GPU clusters. On a mesh with a pp or cp axis (which the automatic\n"
      "view does not place) the hand-coded model runs alone.\n\n"
      "  --config NAME      tiny | small | 125m | 350m | 1.3b | 6b      (default small)\n"
      "  --mesh SPEC        mesh axes dp, mp, pp, cp and fsdp, as for gptj train (default dp=2,mp=2)\n"
      "  --micro-batches N, --schedule 1f1b|gpipe, --zero, --bucket-mb MB  as for gptj train\n"
      "  --remat            as for gptj train, on a mesh where the hand-coded model runs alone (the\n"
      "                     global view has no checkpointing)\n"
      "  --backend B        cpu or cuda, as for gptj train                (default cpu)\n"
      "  --dtype D          f32 or bf16, as for gptj train                (default f32)\n"
      "  --data FILE        a text file to train on (repeat for several)  (required)\n"
      "  --steps N          optimizer steps of each model                 (default 20)\n"
      "  --warmup-steps K   steps left out of the tokens/s median         (default 2)\n"
      "  --batch B, --seq T, --lr X, --warmup N, --seed S                  as for gptj train\n"
      "  --json FILE        write the rows as a JSON list\n"
      "  --cost-model FILE  the alpha-beta cost model for sharding propagation (JSON)\n"
      "  --mfu X            compute efficiency assumed for the projections (default 0.4)\n"
      "  --with-jax         add JAX's jit/NamedSharding baseline (bench/jax_baseline.py) on the same run\n"
      "  --install-jax      with --with-jax: install JAX from PyPI into .venv-jax/ when it is missing\n"
      "  --trace FILE       write a timeline of both models' steps (as for gptj train; each step slice\n"
      "                     names its sharding, scripts/trace_breakdown.py puts them side by side)\n"
      "  --deterministic    both models in deterministic mode, as for gptj train\n"
      "  --sequence-parallel  the hand-coded model with sequence parallelism over mp, as for gptj\n"
      "                     train (the automatic one without); with --meshes, on both meshes\n"
      "  --overlap-pieces N with --sequence-parallel, as for gptj train             (default 2)\n"
      "  --quiet            no progress line\n\n"
      "gptj compare --meshes A,B [--deterministic] [flags]: the locator instead. Runs --steps (default 1)\n"
      "training steps of the hand-coded model on meshes A and B (DPxMP, e.g. 1x1,2x2, or named meshes apart by ';'), every op's values\n"
      "recorded on every device, rebuilt as global tensors and compared op by op; prints the first op whose\n"
      "value differs (its position, name, shape, elements differing, first difference, largest difference)\n"
      "and exits 1, or prints \"no difference in N ops\" and exits 0 (docs/locator.md). Use small configs.\n"
      "  --meshes A,B       the two meshes, DPxMP each (or 'A;B', named: 'cp=2;mp=2,cp=2')\n");
}

int run_compare(int argc, char** argv) {
  gptj::CompareOptions c;
  gptj::TrainOptions& o = c.train;
  o.steps = 20;
  std::string meshes;
  TraceFile trace;
  parse_flags(argc, argv, 2,
              run_flags(o, {{"--trace", trace.flag()},
                            {"--warmup-steps", set_int("--warmup-steps", c.timing_skip)},
                            {"--json", set(c.json)},
                            {"--cost-model", set(c.cost_model)},
                            {"--mfu", set_double("--mfu", c.projected_mfu)},
                            {"--meshes", set(meshes)},
                            {"--micro-batches", set_int("--micro-batches", o.micro_batches)},
                            {"--schedule", set(o.schedule)},
                            {"--bucket-mb", set_double("--bucket-mb", o.bucket_mb)},
                            {"--dtype", [&](const std::string& v) { o.dtype = gptj::parse_compute_dtype(v); }}}),
              compare_help,
              {{"--with-jax", set_true(c.with_jax)},
               {"--remat", set_true(o.remat)},
               {"--zero", set_true(o.zero)},
               {"--install-jax", set_true(c.install_jax)},
               {"--sequence-parallel", set_true(o.sequence_parallel)},
               {"--deterministic", set_true(o.deterministic)},
               {"--quiet", set_true(o.quiet)}});
  if (!meshes.empty()) {
    c.meshes = gptj::split_meshes(meshes);
    if (std::none_of(argv + 2, argv + argc, [](const char* a) { return std::string_view(a) == "--steps"; })) o.steps = 1;
    gptj::check_options(o);
    return gptj::compare_meshes(c, gptj::TextData::load(o.data));
  }
  gptj::check_options(o);
  if (!c.json.empty()) nax::io::check_writable(c.json, "--json");
  if (c.timing_skip < 0 || c.timing_skip >= o.steps) nax::fail("gptj", "--warmup-steps must be at least 0 and below --steps ({})", o.steps);
  if (c.projected_mfu <= 0 || c.projected_mfu > 1) nax::fail("gptj", "--mfu must be in (0, 1]");
  trace.start();
  const auto rows = gptj::compare(c, gptj::TextData::load(o.data));
  trace.finish();
  if (nax::process_index() != 0) return 0;
  gptj::print_comparison(rows, c);
  if (!c.json.empty()) gptj::write_comparison_json(rows, c, c.json);
  return 0;
}

int run_export(int argc, char** argv) {
  gptj::ExportOptions e;
  gptj::TrainOptions& o = e.train;
  parse_flags(argc, argv, 2, run_flags(o, {{"--out", set(e.out)}}), export_help);
  if (e.out.empty()) nax::fail("gptj", "export needs --out DIR");
  gptj::check_options(o);
  gptj::export_run(e, gptj::TextData::load(o.data));
  fmt::print("exported config {} for mesh {} ({} steps of batch {} x seq {}) to {}\n", o.config, o.mesh, o.steps, o.batch, o.seq, e.out);
  return 0;
}

int run_logits(int argc, char** argv) {
  gptj::SampleOptions o;
  parse_flags(argc, argv, 2,
              {{"--ckpt", set(o.ckpt_dir)},
               {"--mesh", set(o.mesh)},
               {"--prompt", set(o.prompt)},
               {"--tokenizer", set(o.tokenizer)}},
              [] {
                fmt::print("usage: gptj logits --ckpt DIR --prompt TEXT [--mesh SPEC] [--tokenizer FILE] [--deterministic] [--allow-nonfinite]\n"
                           "Prints the logits of every prompt position as JSON (--deterministic: the same bits on every mesh;\n"
                           "--allow-nonfinite: load weights holding NaN or infinities, which are refused otherwise).\n");
              },
              {{"--deterministic", set_true(o.deterministic)}, {"--allow-nonfinite", set_true(o.allow_nonfinite)}});
  const auto rows = gptj::prompt_logits(o);
  if (nax::process_index() != 0) return 0;
  std::vector<std::string> lines;
  for (const auto& row : rows) lines.push_back(fmt::format("[{}]", fmt::join(row, ",")));
  fmt::print("[{}]\n", fmt::join(lines, ",\n"));
  return 0;
}

int run_tokenize(int argc, char** argv) {
  gptj::TokenizeOptions o;
  parse_flags(argc, argv, 2,
              {{"--tokenizer", set(o.tokenizer)},
               {"--text",
                [&](const std::string& v) {
                  o.text = v;
                  o.has_text = true;
                }},
               {"--data", set(o.data)},
               {"--out", set(o.out)}},
              [] {
                fmt::print("usage: gptj tokenize --tokenizer tokenizer.json (--text TEXT | --data FILE [--out FILE.tokens]) [--quiet]\n"
                           "--text prints the ids as JSON; --data writes a token file (docs/tokenizer.md).\n");
              },
              {{"--quiet", set_true(o.quiet)}});
  gptj::tokenize_command(o);
  return 0;
}

int run_convert(int argc, char** argv) {
  gptj::ConvertOptions o;
  parse_flags(argc, argv, 2,
              {{"--ckpt", set(o.from)},
               {"--out", set(o.out)},
               {"--dtype", set(o.dtype)},
               {"--max-file-mb",
                [&](const std::string& v) {
                  const double mb = to_double("--max-file-mb", v);
                  if (mb <= 0 || mb > 1e7) nax::fail("gptj", "--max-file-mb must be in (0, 1e7], got {}", v);
                  o.max_file_bytes = static_cast<std::uint64_t>(mb * 1e6);
                }}},
              [] {
                fmt::print("usage: gptj convert --ckpt DIR --out HF_DIR [--dtype f32|bf16|f16] [--max-file-mb N] [--allow-nonfinite]\n"
                           "Writes a model (a run folder's newest step, a step folder or a Hugging Face folder) as a Hugging Face\n"
                           "GPT-J folder: config.json and model.safetensors, or above N MB (default 10000) shards\n"
                           "model-0000k-of-0000n.safetensors with model.safetensors.index.json, in the dtype (default f32).\n"
                           "Weights holding NaN or infinities are refused unless --allow-nonfinite.\n");
              },
              {{"--allow-nonfinite", set_true(o.allow_nonfinite)}});
  if (o.from.empty()) nax::fail("gptj", "convert needs --ckpt DIR");
  if (o.out.empty()) nax::fail("gptj", "convert needs --out DIR");
  const auto files = gptj::convert(o);
  fmt::print("wrote {} to {}\n", fmt::join(files, ", "), o.out);
  return 0;
}

int run_sample(int argc, char** argv) {
  gptj::SampleOptions o;
  TraceFile trace;
  parse_flags(argc, argv, 2,
              {{"--ckpt", set(o.ckpt_dir)},
               {"--trace", trace.flag()},
               {"--backend", [&](const std::string& v) { o.backend = nax::parse_backend(v); }},
               {"--mesh", set(o.mesh)},
               {"--prompt", [&](const std::string& v) { o.prompts.push_back(v); }},
               {"--prompts",
                [&](const std::string& v) {
                  for (auto& p : gptj::read_prompts(v)) o.prompts.push_back(std::move(p));
                }},
               {"--tokens", set_int("--tokens", o.tokens)},
               {"--temperature", set_double("--temperature", o.temperature)},
               {"--top-k", set_int("--top-k", o.top_k)},
               {"--top-p", set_double("--top-p", o.top_p)},
               {"--seed", set_int("--seed", o.seed)},
               {"--tokenizer", set(o.tokenizer)}},
              sample_help,
              {{"--ignore-eos", [&](const std::string&) { o.stop_at_eos = false; }},
               {"--deterministic", set_true(o.deterministic)},
               {"--allow-nonfinite", set_true(o.allow_nonfinite)}});
  trace.start();
  if (o.prompts.empty()) o.prompts.push_back("");
  const auto texts = gptj::sample_batch(o);
  trace.finish();
  if (nax::process_index() != 0) return 0;
  if (texts.size() == 1) {
    fmt::print("{}{}\n", o.prompts[0], texts[0]);
    return 0;
  }
  for (std::size_t k = 0; k < texts.size(); ++k)  // one JSON object a line; bytes that are not UTF-8 become U+FFFD
    fmt::print("{}\n", nlohmann::json{{"prompt", o.prompts[k]}, {"text", texts[k]}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  return 0;
}

int run_plan(int argc, char** argv) {
  gptj::PlanOptions o;
  parse_flags(argc, argv, 2,
              {{"--config", set(o.config)},
               {"--mesh", set(o.mesh)},
               {"--batch", set_int("--batch", o.batch)},
               {"--seq", set_int("--seq", o.seq)},
               {"--micro-batches", set_int("--micro-batches", o.micro_batches)},
               {"--schedule", set(o.schedule)},
               {"--bucket-mb", set_double("--bucket-mb", o.bucket_mb)},
               {"--dtype", [&](const std::string& v) { o.dtype = gptj::parse_compute_dtype(v); }},
               {"--device-memory", [&](const std::string& v) { o.device_memory = gptj::parse_bytes(v); }}},
              [] {
                fmt::print(
                    "usage: gptj plan [flags]\n"
                    "Prints the bytes per device that gptj train needs: parameters, gradients, optimizer state,\n"
                    "activations and the peak, and whether the peak fits the device (docs/memory.md).\n\n"
                    "  --config NAME      tiny | small | 125m | 350m | 1.3b | 6b      (default small)\n"
                    "  --mesh SPEC        dp, mp, pp, cp, fsdp, e.g. dp=1,mp=8, pp=4 or fsdp=8 (default dp=1,mp=1)\n"
                    "  --batch B          global batch, cut over dp and fsdp            (default 8)\n"
                    "  --seq T            tokens per sequence                           (default 128)\n"
                    "  --micro-batches M  as for gptj train: each holds batch / M      (default 1)\n"
                    "  --bucket-mb MB     as for gptj train: the gradients' dp buckets   (default 25)\n"
                    "  --schedule S       with pp: 1f1b or gpipe, as for gptj train     (default 1f1b)\n"
                    "  --dtype D          f32 or bf16, as for gptj train                (default f32)\n"
                    "  --remat            activation checkpointing per block, as for gptj train\n"
                    "  --zero             AdamW's moments cut over dp, as for gptj train\n"
                    "  --sequence-parallel  activations between blocks cut along seq over mp, as for gptj train\n"
                    "  --deterministic    deterministic mode's psums of terms, as for gptj train (f32)\n"
                    "  --device-memory M  e.g. 141GB, 80GiB                             (default 141GB, an H200)\n");
              },
              {{"--remat", set_true(o.remat)}, {"--zero", set_true(o.zero)}, {"--sequence-parallel", set_true(o.sequence_parallel)},
               {"--deterministic", set_true(o.deterministic)}});
  fmt::print("{}", gptj::format_plan(o, gptj::plan_memory(o)));
  return 0;
}

int run_command(int argc, char** argv) {
  const std::string command = argc > 1 ? argv[1] : "--help";
  if (command == "train") return run_train(argc, argv);
  if (command == "sample") return run_sample(argc, argv);
  if (command == "logits") return run_logits(argc, argv);
  if (command == "export") return run_export(argc, argv);
  if (command == "compare") return run_compare(argc, argv);
  if (command == "tokenize") return run_tokenize(argc, argv);
  if (command == "convert") return run_convert(argc, argv);
  if (command == "plan") return run_plan(argc, argv);
  if (command == "--help" || command == "-h" || command == "help") {
    fmt::print("usage: gptj <train|sample|logits|compare|export|tokenize|convert|plan> [flags]   (gptj <command> --help for the flags)\n");
    return argc > 1 ? 0 : 2;
  }
  nax::fail("gptj", "unknown command '{}' (expected train, sample, logits, compare, export, tokenize, convert or plan)", command);
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGXFSZ, SIG_IGN);  // a file size limit: a write error naming the file, not a kill
  int code = 1;
  try {
    code = run_command(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
  }
  // The results printed are the command's output too: a full disk or a closed pipe is an error.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    fmt::print(stderr, "error: gptj: cannot write the standard output: {}\n", std::strerror(errno));
    return 1;
  }
  return code;
}
