#pragma once
// What each kind of file nax is given may hold: bytes, and for JSON how deep its values nest and
// how many there are. Each cap is proportionate to its kind (a model's config is kilobytes, a
// tokenizer megabytes, a training text may be gigabytes) and is named in the refusal, e.g.
//   tokenizer: 'big.json' has 21474836480 bytes, over the cap of 64 MiB for a tokenizer.json
// docs/input-limits.md lists them with what real files of each kind hold.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace nax::io {

struct FileCaps {
  std::string_view kind;          // what the messages call the file: "tokenizer.json"
  std::uint64_t max_bytes = 0;
  std::size_t max_depth = 0;      // JSON: containers (objects and arrays) nested, the top one included
  std::size_t max_values = 0;     // JSON: values of any type, containers included
};

inline constexpr std::uint64_t kMiB = 1ull << 20;

// JSON files.
inline constexpr FileCaps kModelConfigCaps{"config.json", 1 * kMiB, 16, 100'000};
inline constexpr FileCaps kWeightsIndexCaps{"model.safetensors.index.json", 16 * kMiB, 8, 1'000'000};
inline constexpr FileCaps kTokenizerCaps{"tokenizer.json", 64 * kMiB, 16, 4'000'000};
inline constexpr FileCaps kManifestCaps{"manifest.json", 1 * kMiB, 8, 10'000};
inline constexpr FileCaps kTrainerStateCaps{"trainer.json", 4 * kMiB, 8, 200'000};
inline constexpr FileCaps kSafetensorsHeaderCaps{"safetensors header", 100'000'000, 8, 4'000'000};  // the format's own limit
inline constexpr FileCaps kCostModelCaps{"cost model", 1 * kMiB, 8, 10'000};
inline constexpr FileCaps kResultRowsCaps{"result rows", 16 * kMiB, 8, 1'000'000};  // a baseline's JSON results, read back

// Other files.
inline constexpr FileCaps kPromptsCaps{"prompts file", 16 * kMiB};
inline constexpr FileCaps kTrainingTextCaps{"training text", 64ull << 30};
inline constexpr FileCaps kTokenFileCaps{"token file", 64ull << 30};

// Token ids a tokenizer may give: below 2^24, the largest vocabulary a GPT-J config of nax has.
inline constexpr std::int64_t kMaxTokenIds = std::int64_t{1} << 24;

}  // namespace nax::io
