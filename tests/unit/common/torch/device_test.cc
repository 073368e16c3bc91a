// Device parsing, DeviceAudit itself (it must catch a planted CPU tensor next
// to a device input, including where the op does not check), and the shared
// model blocks run on the meta device under it.
#include "tests/testing/device_audit.h"

#include <torch/torch.h>

#include <gtest/gtest.h>

#include "common/torch/blocks.h"
#include "common/torch/tensor_util.h"

namespace specstream {
namespace {

using testing::DeviceAudit;

torch::TensorOptions Meta() { return torch::TensorOptions().device(torch::kMeta); }

TEST(ParseDeviceTest, KnownDevicesAndWhyOthersAreRefused) {
  auto cpu = ParseDevice("cpu", "--devices");
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_TRUE(cpu->is_cpu());
  auto meta = ParseDevice("meta", "--devices");
  ASSERT_TRUE(meta.ok()) << meta.status();
  EXPECT_TRUE(meta->is_meta());
  for (const char* bad : {"gpu0", "cuda:", "cuda:x", "cuda:-1", "CPU", ""}) {
    auto parsed = ParseDevice(bad, "training.device");
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(parsed.status().message().find("training.device: unknown device"), std::string::npos)
        << parsed.status();
  }
  auto cuda = ParseDevice("cuda:0", "--devices");
  if (torch::cuda::is_available()) {
    EXPECT_TRUE(cuda.ok()) << cuda.status();
  } else {
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(cuda.status().message().find("\"cuda:0\" needs CUDA"), std::string::npos)
        << cuda.status();
  }
  if (torch::cuda::is_available()) {
    const std::string past = "cuda:" + std::to_string(torch::cuda::device_count());
    EXPECT_EQ(ParseDevice(past, "--devices").status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

TEST(DeviceAuditTest, CatchesAPlantedHostTensorNextToADeviceInput) {
  torch::Tensor x = torch::ones({4, 4}, Meta());
  DeviceAudit audit;
  // matmul on meta accepts the CPU operand without a word: only the audit sees it.
  torch::Tensor y = torch::matmul(x, torch::ones({4, 4}));
  // The planted mistake of the issue: positions made without x's options.
  EXPECT_ANY_THROW(x + torch::arange(4));
  ASSERT_GE(audit.mixed().size(), 2u);
  EXPECT_NE(audit.mixed()[0].find("meta [4, 4]"), std::string::npos) << audit.mixed()[0];
  EXPECT_NE(audit.mixed()[0].find("cpu [4, 4]"), std::string::npos) << audit.mixed()[0];
  bool saw_add = false;
  for (const std::string& line : audit.mixed()) saw_add |= line.find("add") != std::string::npos;
  EXPECT_TRUE(saw_add);
}

TEST(DeviceAuditTest, QuietWhenTensorsFollowTheirInputs) {
  torch::Tensor x = torch::ones({4, 4}, Meta());
  DeviceAudit audit;
  torch::Tensor y = torch::matmul(x, torch::ones({4, 4}, x.options())) +
                    torch::arange(4, x.options()) * 2.0;  // a CPU scalar is fine
  EXPECT_GT(audit.ops(), 0);
  EXPECT_TRUE(audit.mixed().empty()) << audit.mixed()[0];
  EXPECT_TRUE(y.is_meta());
}

// RMSNorm, rotary tables, rotary application and the blockwise attention
// kernel (with and without a window) on meta inputs make nothing on the host
// that meets them.
TEST(DeviceAuditTest, ModelBlocksKeepToTheirInputsDevice) {
  const int64_t t = 24, heads = 4, kv = 2, d = 8;
  auto rotary = nn::Rotary::Create(d, 10000.0, RopeScaling{}, 4096);
  ASSERT_TRUE(rotary.ok());
  torch::Tensor h = torch::ones({1, t, heads * d}, Meta());
  torch::Tensor w = torch::ones({heads * d}, Meta());
  torch::Tensor q = torch::ones({1, heads, t, d}, Meta());
  torch::Tensor k = torch::ones({1, kv, t, d}, Meta()), v = torch::ones({1, kv, t, d}, Meta());
  DeviceAudit audit;
  torch::Tensor normed = nn::RmsNorm(h, w, 1e-6);
  auto [cos, sin] = rotary->CosSin(torch::arange(t, Meta().dtype(torch::kInt64)), torch::kFloat32);
  torch::Tensor qr = nn::ApplyRotary(q, cos, sin), kr = nn::ApplyRotary(k, cos, sin);
  nn::AttentionOptions blockwise;
  blockwise.fused = false;
  blockwise.max_score_elements = heads * t * 8;  // several query blocks
  nn::AttentionOptions window = blockwise;
  window.sliding_window = 5;
  // The fused kernel (2.x) is LibTorch's own; ours is what feeds it, and the
  // blockwise kernels, which build their masks from positions.
  torch::Tensor outputs[] = {nn::CausalAttention(qr, kr, v, blockwise),
                             nn::CausalAttention(qr, kr, v, window)};
  EXPECT_TRUE(audit.mixed().empty()) << audit.mixed()[0];
  EXPECT_TRUE(normed.is_meta() && cos.is_meta());
  for (const torch::Tensor& o : outputs) {
    EXPECT_TRUE(o.is_meta());
    EXPECT_EQ(o.sizes(), (std::vector<int64_t>{1, heads, t, d}));
  }
}

}  // namespace
}  // namespace specstream
