// The target runtimes keep to their device: on the meta device under a
// DeviceAudit (tests/testing/device_audit.h), the weights load there, the
// host-side request is moved there, and no op meets a tensor made on the
// host (ids, padding, positions, rotary tables, masks, argmax buffers).
// MoE routing is data-dependent (expert counts) and cannot run on meta.
#include <torch/torch.h>

#include <gtest/gtest.h>

#include "common/torch/compat.h"
#include "teacher/tp_launcher.h"
#include "tests/testing/device_audit.h"
#include "tests/testing/testing.h"
#include "tests/testing/tiny_model.h"

namespace specstream::teacher {
namespace {

using specstream::testing::DeviceAudit;

TEST(RuntimeDeviceTest, DenseRuntimesOnMetaMakeNothingOnTheHost) {
  if (!SPECSTREAM_TORCH_2) {
    GTEST_SKIP() << "LibTorch 1.13 has no meta kernel for index_select (the embedding lookup); "
                    "this check runs on LibTorch 2.x (tests/torch2.sh)";
  }
  for (const char* arch : {"llama", "qwen3", "qwen2"}) {
    specstream::testing::TempDir dir;
    specstream::testing::TinyModelOptions model;
    model.arch = arch;
    specstream::testing::WriteTinyModel(dir.path(), model);
    for (const char* name : {"hf", "sglang"}) {
      SCOPED_TRACE(std::string(arch) + " on " + name);
      TargetRuntimeOptions options;
      options.model_dir = dir.path();
      options.dtype = "float32";
      options.device = "meta";
      options.max_score_elements = 64;  // several attention blocks
      auto runtime = CreateTargetRuntime(name, options);
      ASSERT_TRUE(runtime.ok()) << runtime.status();
      ForwardRequest request;
      request.want_target_ids = true;
      request.sequences = {specstream::testing::RandomTokens(9, model.vocab, 1),
                           specstream::testing::RandomTokens(5, model.vocab, 2)};
      DeviceAudit audit;
      auto captures = (*runtime)->Forward(request);
      ASSERT_TRUE(captures.ok()) << captures.status();
      EXPECT_GT(audit.ops(), 100);
      EXPECT_TRUE(audit.mixed().empty())
          << audit.mixed().size() << " ops, first " << audit.mixed()[0];
      ASSERT_EQ(captures->size(), 2u);
      for (size_t s = 0; s < 2; ++s) {
        const SequenceCapture& c = (*captures)[s];
        const int64_t t = static_cast<int64_t>(request.sequences[s].size());
        EXPECT_TRUE(c.aux_hidden.is_meta() && c.last_hidden.is_meta() && c.target_ids.is_meta());
        EXPECT_EQ(c.aux_hidden.sizes(), (std::vector<int64_t>{t, 3 * model.hidden}));
        EXPECT_EQ(c.target_ids.scalar_type(), torch::kInt32);
      }
    }
  }
}

TEST(RuntimeDeviceTest, UnknownDeviceIsRefusedByName) {
  specstream::testing::TempDir dir;
  specstream::testing::TinyModelOptions model;
  specstream::testing::WriteTinyModel(dir.path(), model);
  TargetRuntimeOptions options;
  options.model_dir = dir.path();
  options.device = "tpu:0";
  auto runtime = CreateTargetRuntime("hf", options);
  ASSERT_FALSE(runtime.ok());
  EXPECT_NE(runtime.status().message().find("device: unknown device \"tpu:0\""), std::string::npos)
      << runtime.status();
}

}  // namespace
}  // namespace specstream::teacher
