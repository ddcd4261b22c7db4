#pragma once
// GPT-J-style model configurations, from a test-sized one to GPT-J-6B's dimensions.
#include <nax/nax.h>

#include <cstdint>
#include <string>
#include <vector>

namespace gptj {

struct Config {
  std::string name;
  std::int64_t vocab = 256;
  std::int64_t d_model = 64;
  std::int64_t n_layers = 2;
  std::int64_t n_heads = 4;
  std::int64_t head_dim = 16;
  std::int64_t d_ff = 256;  // 4 d_model
  std::int64_t rotary_dims = 8;
  std::int64_t max_seq = 2048;
  double layer_norm_eps = 1e-5;  // Hugging Face's layer_norm_epsilon
  // Hugging Face's bos_token_id and eos_token_id (sampling stops at eos); GPT-J's <|endoftext|>
  // is 50256, the byte vocabulary has none (0, as nax has always written).
  std::int64_t bos_token_id = 0, eos_token_id = 0;
};

// tiny, small, 125m, 350m, 1.3b, 6b; throws naming the known ones otherwise.
Config config_by_name(const std::string& name);
std::vector<std::string> config_names();

// The byte-level vocabulary (256) padded up to a multiple of the mesh's mp size, so that any mp
// can cut it; other vocabularies are returned as they are.
Config padded_for(Config c, const nax::Mesh& mesh);

// `c` with room for `vocab` ids: a larger vocabulary (a tokenizer's) rounded up to a multiple of
// mp, as GPT-J pads 50257 to 50400; a config that already has room is returned as it is.
Config with_vocab_at_least(Config c, std::int64_t vocab, const nax::Mesh& mesh);

// The most devices a mesh may have here: a simulated device is a thread, and a mesh beyond this
// is a typo (dp=1024,mp=4) rather than a plan; under mpirun, a process each.
inline constexpr int kMaxDevices = 256;

// The mesh of a --mesh spec: any of the model's axes dp, mp, pp, cp and fsdp, in any order; dp and mp,
// which the model always names, are added with size 1 when the spec leaves them out.
nax::Mesh model_mesh(const std::string& spec);
// The size of the mesh's cp axis (context parallelism), 1 without one; and of its fsdp axis (fully
// sharded data parallelism: the batch and the parameters cut over it).
inline int context_devices(const nax::Mesh& mesh) { return mesh.has("cp") ? mesh.axis_size("cp") : 1; }
inline int fsdp_devices(const nax::Mesh& mesh) { return mesh.has("fsdp") ? mesh.axis_size("fsdp") : 1; }
// The size of the mesh's pp axis: the pipeline's stages, each a run of consecutive layers (pipeline.h).
inline int pipeline_stages(const nax::Mesh& mesh) { return mesh.has("pp") ? mesh.axis_size("pp") : 1; }
// The devices the batch is cut over: dp x fsdp.
inline int data_parallel_devices(const nax::Mesh& mesh) { return (mesh.has("dp") ? mesh.axis_size("dp") : 1) * fsdp_devices(mesh); }

// Checks that the mesh has the model's axes only (dp, mp, pp, cp, fsdp), at most kMaxDevices devices,
// and divides the model (heads, d_ff and vocab over mp, d_model over fsdp, a layer at least per pp
// stage) and the batch (over dp and fsdp), with one clear message per failure.
void check_fits(const Config& c, const nax::Mesh& mesh, std::int64_t batch);
// Checks that `micro` micro-batches divide each data-parallel device's rows of the batch; errors
// start with `command`.
void check_micro_batches(const nax::Mesh& mesh, std::int64_t batch, std::int64_t micro, const char* command);

// How the sequence of a training run is cut: over mp with sequence parallelism, over cp by context
// parallelism (each device two chunks of 2 cp, zigzag; in deterministic mode one contiguous block,
// the heads and d_ff cut over mp x cp, mp listed before cp: docs/determinism.md). Checks that the
// cuts divide seq and the heads. The two do not combine yet.
void check_sequence_layout(const nax::Mesh& mesh, std::int64_t seq, bool sequence_parallel, bool deterministic, const Config& c);
// Whether the mesh has no cp, fsdp or pp axis of more than one device.
bool dp_mp_only(const nax::Mesh& mesh);
// Whether the global view (--sharding auto) can place the model on the mesh: dp, mp and fsdp (its
// cut parameters are placements; propagation gathers them where used), not cp's ring nor pp's stages.
bool placed_automatically(const nax::Mesh& mesh);
// gptj commands without context parallelism, FSDP or pipelines (generation, export, the global
// view) refuse a cp, fsdp or pp axis, naming `what`.
void check_dp_mp_only(const nax::Mesh& mesh, const char* what);

// A lower bound of the host memory one training step needs over the whole mesh, in bytes: f32
// parameters, gradients and AdamW's two moments, plus the activations the backward keeps (each
// layer's inputs, attention and MLP activations, and the logits). Doubles: no overflow.
double training_bytes_lower_bound(const Config& c, std::int64_t batch, std::int64_t seq);

// Weights of the model (excluding nothing: embeddings included).
std::int64_t parameter_count(const Config& c);

// Training FLOPs per token, PaLM's formula: 6 N + 12 L H Q T.
double flops_per_token(const Config& c, std::int64_t seq);

// Dense peak of one H100/H200 SXM (NVIDIA's datasheet): bf16 tensor cores, and f32 without TF32
// (CUBLAS_COMPUTE_32F, what nax's f32 GEMMs ask for). MFU on GPUs and the cluster projections use it.
inline constexpr double kGpuPeakBf16Flops = 989e12, kGpuPeakF32Flops = 67e12;
inline double gpu_peak_flops(nax::DType compute) { return compute == nax::DType::bf16 ? kGpuPeakBf16Flops : kGpuPeakF32Flops; }

// Mixed precision: the parameters stay the (f32) master weights and are cast to bf16 where the model
// uses them, so activations and their gradients are bf16 and the cast's backward hands f32
// gradients to the parameters. Any other compute dtype means no cast: the model computes in the
// parameters' own dtype (f32 in training, f64 in the gradient checks). T: nax::Tensor (the
// per-shard model) or nax::GlobalTensor (the global view).
template <typename T>
T for_compute(const T& param, nax::DType compute) {
  return compute == nax::DType::bf16 ? nax::cast(param, compute) : param;
}

// Logits for the loss: bf16 ones are cast to f32, so that the cross-entropy and the loss are f32.
template <typename T>
T loss_precision(const T& logits) {
  return logits.dtype() == nax::DType::bf16 ? nax::cast(logits, nax::DType::f32) : logits;
}

}  // namespace gptj
