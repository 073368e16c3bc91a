#include "common/model_contract.h"

#include <string>

#include "gtest/gtest.h"

namespace specstream {
namespace {

nlohmann::json Good() {
  return {{"model_type", "llama"}, {"runtime", "hf"}, {"hidden_size", 64},
          {"vocab_size", 128},     {"num_layers", 4}, {"capture_layer_ids", {1, 2}}};
}

TEST(ModelContractTest, RoundTripsThroughJson) {
  auto contract = ModelContract::FromJson(Good());
  ASSERT_TRUE(contract.ok()) << contract.status();
  EXPECT_EQ(contract->model_type, "llama");
  EXPECT_EQ(contract->runtime, "hf");
  EXPECT_EQ(contract->hidden_size, 64);
  EXPECT_EQ(contract->vocab_size, 128);
  EXPECT_EQ(contract->num_layers, 4);
  EXPECT_EQ(contract->capture_layer_ids, (std::vector<int>{1, 2}));
  EXPECT_EQ(contract->ToJson(), Good());

  nlohmann::json online = Good();
  online.erase("runtime");  // teachers online do not state it
  auto unstated = ModelContract::FromJson(online);
  ASSERT_TRUE(unstated.ok()) << unstated.status();
  EXPECT_EQ(unstated->runtime, "");
  EXPECT_EQ(unstated->ToJson(), online);
}

TEST(ModelContractTest, BadFieldsAreNamed) {
  struct Case {
    const char* field;
    nlohmann::json value;  // null: remove the field
    std::string named;
  };
  const Case cases[] = {
      {"model_type", nullptr, "store.model.model_type"},
      {"model_type", "", "store.model.model_type"},
      {"runtime", 3, "store.model.runtime"},
      {"hidden_size", nullptr, "store.model.hidden_size: missing"},
      {"hidden_size", "64", "store.model.hidden_size: must be an integer"},
      {"vocab_size", 0, "store.model.vocab_size: must be positive, got 0"},
      {"num_layers", -4, "store.model.num_layers: must be positive"},
      {"capture_layer_ids", nlohmann::json::array(), "store.model.capture_layer_ids"},
      {"capture_layer_ids", {1, 4}, "store.model.capture_layer_ids[1]: 4 is not a layer in [0, 4)"},
      {"capture_layer_ids", {-1}, "store.model.capture_layer_ids[0]"},
  };
  for (const Case& c : cases) {
    nlohmann::json json = Good();
    if (c.value.is_null()) {
      json.erase(c.field);
    } else {
      json[c.field] = c.value;
    }
    auto contract = ModelContract::FromJson(json, "store.model");
    ASSERT_FALSE(contract.ok()) << c.field << " = " << c.value.dump();
    EXPECT_EQ(contract.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(contract.status().message().find(c.named), std::string::npos)
        << contract.status() << " should name " << c.named;
  }
  auto not_object = ModelContract::FromJson(nlohmann::json::array());
  EXPECT_NE(not_object.status().message().find("contract.model: must be an object"),
            std::string::npos)
      << not_object.status();
}

TEST(ModelContractTest, FirstDifferenceNamesTheFieldAndIgnoresTheRuntime) {
  const ModelContract a = *ModelContract::FromJson(Good());
  ModelContract b = a;
  b.runtime = "sglang";
  EXPECT_EQ(a.FirstDifference(b), "");
  b.capture_layer_ids = {1, 3};
  EXPECT_EQ(a.FirstDifference(b), "capture_layer_ids");
  b.num_layers = 5;
  EXPECT_EQ(a.FirstDifference(b), "num_layers");
  b.vocab_size = 7;
  EXPECT_EQ(a.FirstDifference(b), "vocab_size");
  b.hidden_size = 65;
  EXPECT_EQ(a.FirstDifference(b), "hidden_size");
  b.model_type = "qwen3";
  EXPECT_EQ(a.FirstDifference(b), "model_type");
}

}  // namespace
}  // namespace specstream
