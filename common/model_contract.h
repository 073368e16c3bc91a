// The target model a stream of samples was computed from: `contract.model`
// in an offline store's index.json (DESIGN §7), and what TeacherService's
// Describe answers online. A trainer checks it against its own target before
// training, and the teachers of one job must agree on it. LibTorch-free.
//
// JSON (the store's index.json):
//   {"model_type": "llama", "runtime": "hf", "hidden_size": 576,
//    "vocab_size": 49152, "num_layers": 30, "capture_layer_ids": [1, 14, 26]}
// "runtime" (hf | sglang) is optional: it records which runtime computed a
// store (a resumed dump must keep it); online teachers do not state it.
//
// Thread-safety: a value type.
#ifndef SPECSTREAM_COMMON_MODEL_CONTRACT_H_
#define SPECSTREAM_COMMON_MODEL_CONTRACT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/capture_layers.h"
#include "nlohmann/json.hpp"

namespace specstream {

struct ModelContract {
  std::string model_type;  // e.g. "llama", "qwen3"
  std::string runtime;     // "hf" | "sglang"; "" when not stated
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t num_layers = 0;
  // Decoder layers whose outputs are concatenated in aux_hidden, in order
  // (SGLang convention: id k = output of layer k), each in [0, num_layers).
  CaptureLayerIds capture_layer_ids;

  // The JSON above ("runtime" only when stated).
  nlohmann::json ToJson() const;
  // Parses and checks `json` (`where` names it in errors, e.g.
  // "contract.model"): InvalidArgument naming `where.field` when a field is
  // missing or ill-typed, a size is not positive, there is no capture id, or
  // one lies outside [0, num_layers). Unknown fields are ignored.
  static absl::StatusOr<ModelContract> FromJson(const nlohmann::json& json,
                                                const std::string& where = "contract.model");

  // The first field in which two contracts describe different targets
  // ("model_type", "hidden_size", "vocab_size", "num_layers",
  // "capture_layer_ids"), or "" when they describe the same one. "runtime" is
  // not compared: the hf and sglang runtimes capture the same states.
  std::string FirstDifference(const ModelContract& other) const;
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_MODEL_CONTRACT_H_
