// libFuzzer target for config.json parsing (common/hf_config.h
// ParseHfConfig), rope_parameters and rope_scaling included.
//
// Oracles: any bytes get a status, never a crash or an uncaught exception;
// every refusal is InvalidArgument; an accepted config passes
// ValidateHfConfig; HfConfigToJson writes it as a config.json that parses
// back to the same config, every field (what the teacher serves is what a
// written config.json, e.g. an export's, describes); and where the model
// has the layers for EAGLE-3's default capture ids, they are servable.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/capture_layers.h"
#include "common/hf_config.h"

namespace {

using specstream::HfModelConfig;
using specstream::RopeScaling;

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "hf_config_fuzz: %s:\n%s\n", what, detail.c_str());
  std::abort();
}

// Doubles in full (StrCat keeps six digits).
std::string D(double value) { return absl::StrFormat("%.17g", value); }
std::string Opt(const std::optional<int64_t>& value) {
  return value ? absl::StrCat(*value) : "none";
}
std::string Opt(const std::optional<double>& value) { return value ? D(*value) : "none"; }

// Every field, for comparing two configs (HfModelConfig has no operator==).
std::string Fields(const HfModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  return absl::StrCat(
      "model_type=", c.model_type, " architectures=[", absl::StrJoin(c.architectures, ","),
      "] vocab_size=", c.vocab_size, " hidden_size=", c.hidden_size,
      " intermediate_size=", c.intermediate_size, " num_hidden_layers=", c.num_hidden_layers,
      " num_attention_heads=", c.num_attention_heads,
      " num_key_value_heads=", c.num_key_value_heads, " head_dim=", c.head_dim,
      " max_position_embeddings=", c.max_position_embeddings, " rope_theta=", D(c.rope_theta),
      "\nrope_scaling=", specstream::RopeScalingKindName(rs.kind), " factor=", D(rs.factor),
      " original_max_position_embeddings=", Opt(rs.original_max_position_embeddings),
      " low_freq_factor=", D(rs.low_freq_factor), " high_freq_factor=", D(rs.high_freq_factor),
      " beta_fast=", D(rs.beta_fast), " beta_slow=", D(rs.beta_slow), " mscale=", Opt(rs.mscale),
      " mscale_all_dim=", Opt(rs.mscale_all_dim), " attention_factor=", Opt(rs.attention_factor),
      "\nrms_norm_eps=", D(c.rms_norm_eps), " tie_word_embeddings=", c.tie_word_embeddings,
      " attention_bias=", c.attention_bias, " mlp_bias=", c.mlp_bias, " hidden_act=", c.hidden_act,
      " sliding_window=", Opt(c.sliding_window), " max_window_layers=", Opt(c.max_window_layers),
      " torch_dtype=", c.torch_dtype, " bos_token_id=", Opt(c.bos_token_id), " eos_token_ids=[",
      absl::StrJoin(c.eos_token_ids, ","), "] eos_token_id_is_list=", c.eos_token_id_is_list,
      "\nnum_experts=", c.num_experts, " num_experts_per_tok=", c.num_experts_per_tok,
      " moe_intermediate_size=", c.moe_intermediate_size, " norm_topk_prob=", c.norm_topk_prob,
      " decoder_sparse_step=", c.decoder_sparse_step, " mlp_only_layers=[",
      absl::StrJoin(c.mlp_only_layers, ","),
      "] shared_expert_intermediate_size=", Opt(c.shared_expert_intermediate_size),
      " router_aux_loss_coef=", D(c.router_aux_loss_coef));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<HfModelConfig> config = specstream::ParseHfConfig(text);
  if (!config.ok()) {
    if (config.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("a refusal that is not InvalidArgument", config.status().ToString());
    }
    return 0;
  }
  if (absl::Status valid = specstream::ValidateHfConfig(*config); !valid.ok()) {
    Fail("an accepted config does not validate", valid.ToString());
  }

  const std::string written = specstream::HfConfigToJson(*config);
  absl::StatusOr<HfModelConfig> reread = specstream::ParseHfConfig(written);
  if (!reread.ok()) {
    Fail("the written config.json is refused",
         absl::StrCat(reread.status().ToString(), "\n--- written:\n", written));
  }
  if (Fields(*reread) != Fields(*config)) {
    Fail("the written config.json parses to another config",
         absl::StrCat(Fields(*config), "\n--- became:\n", Fields(*reread), "\n--- written:\n",
                      written));
  }

  if (config->num_hidden_layers >= 8 &&
      config->num_hidden_layers <= specstream::kMaxCaptureTargetLayers) {
    absl::StatusOr<specstream::CaptureLayerIds> layers =
        specstream::DefaultEagle3CaptureLayers(config->num_hidden_layers);
    if (!layers.ok()) Fail("no default capture layers", layers.status().ToString());
    if (absl::Status servable =
            specstream::ValidateEagle3CaptureLayers(*layers, config->num_hidden_layers);
        !servable.ok()) {
      Fail("the default capture layers are not servable", servable.ToString());
    }
  }
  return 0;
}
