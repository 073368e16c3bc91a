#include "tests/testing/tiny_model.h"

#include "common/file.h"
#include "gtest/gtest.h"
#include "teacher/init_random.h"
#include "tests/testing/testing.h"

namespace specstream::testing {

void WriteTinyModel(const std::string& dir, const TinyModelOptions& o) {
  teacher::InitRandomOptions init;
  init.arch = o.arch;
  init.layers = o.layers;
  init.hidden = o.hidden;
  init.heads = o.heads;
  init.kv_heads = o.kv_heads;
  init.intermediate = o.intermediate;
  init.vocab = o.vocab;
  init.shards = o.shards;
  init.seed = static_cast<uint64_t>(o.seed);
  init.dtype = o.dtype;
  init.tie_embeddings = o.tie_embeddings;
  init.experts = o.experts;
  init.top_k = o.top_k;
  init.shared_expert_intermediate = o.shared_expert_intermediate;
  init.mlp_only_layers = o.mlp_only_layers;
  init.out = dir;
  absl::Status status = teacher::WriteRandomCheckpoint(init);
  ASSERT_TRUE(status.ok()) << status;
  if (o.edit_config) {
    auto config = LoadHfConfig(dir);
    ASSERT_TRUE(config.ok()) << config.status();
    o.edit_config(*config);
    ASSERT_TRUE(WriteFileAtomically(dir + "/config.json", HfConfigToJson(*config)).ok());
  }
}

void WriteTokenizedSamples(const std::string& path, int samples, uint64_t seed, int stride,
                           int vocab) {
  std::string data;
  uint64_t state = seed;
  for (int i = 0; i < samples; ++i) {
    const int len = 12 + (i * stride) % 20;
    std::string ids, mask;
    for (int t = 0; t < len; ++t) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      ids += (t ? "," : "") + std::to_string((state >> 33) % vocab);
      mask += (t ? "," : "") + std::string(t < 3 ? "0" : "1");
    }
    data += "{\"input_ids\":[" + ids + "],\"loss_mask\":[" + mask + "]}\n";
  }
  WriteFile(path, data);
}

std::vector<int32_t> RandomTokens(int n, int vocab, int seed) {
  std::vector<int32_t> ids;
  uint64_t state = static_cast<uint64_t>(seed) * 2654435761u + 1;
  for (int i = 0; i < n; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    ids.push_back(static_cast<int32_t>((state >> 33) % static_cast<uint64_t>(vocab)));
  }
  return ids;
}

}  // namespace specstream::testing
