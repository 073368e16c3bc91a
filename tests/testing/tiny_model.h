// Tiny random target checkpoints for tests, written through the same code as
// `specstream-teacher init-random`, with optional config tweaks (rope
// scaling, sliding window) that init-random has no flags for.
#ifndef SPECSTREAM_TESTS_TESTING_TINY_MODEL_H_
#define SPECSTREAM_TESTS_TESTING_TINY_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/hf_config.h"

namespace specstream::testing {

struct TinyModelOptions {
  std::string arch = "llama";
  int layers = 8;
  int hidden = 32;
  int heads = 4;
  int kv_heads = 2;
  int intermediate = 64;
  int vocab = 128;
  int shards = 1;
  int seed = 1;
  bool tie_embeddings = false;
  std::string dtype = "float32";
  // MoE archs (qwen3_moe, mixtral) only.
  int experts = 0;
  int top_k = 0;
  int shared_expert_intermediate = 0;
  std::vector<int64_t> mlp_only_layers;  // qwen3_moe
  // Applied to the config after it is written.
  std::function<void(HfModelConfig&)> edit_config;
};

// Writes the checkpoint into `dir`; aborts the test on failure.
void WriteTinyModel(const std::string& dir, const TinyModelOptions& options);

// Writes `samples` pre-tokenized JSONL records ({"input_ids", "loss_mask"})
// to `path`: sample i has 12 + (i * stride) % 20 tokens drawn from [0, vocab)
// by a 64-bit LCG seeded with `seed`, the first three masked out.
void WriteTokenizedSamples(const std::string& path, int samples, uint64_t seed, int stride,
                           int vocab);

// `n` token ids in [0, vocab) from a 64-bit LCG seeded with `seed`.
std::vector<int32_t> RandomTokens(int n, int vocab, int seed);

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_TINY_MODEL_H_
