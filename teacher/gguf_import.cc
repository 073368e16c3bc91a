#include "teacher/gguf_import.h"

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "common/file.h"
#include "common/gguf.h"
#include "common/safetensors.h"
#include "common/status.h"

namespace specstream::teacher {
namespace {

// tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
constexpr int kTokenControl = 3;
constexpr int kTokenUserDefined = 4;

absl::Status KeyError(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("GGUF metadata ", key, ": ", why));
}

absl::StatusOr<int64_t> RequiredInt(const nlohmann::json& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end()) return KeyError(key, "missing");
  if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
    return KeyError(key, "must be a positive integer");
  }
  return it->get<int64_t>();
}

absl::StatusOr<double> OptionalNumber(const nlohmann::json& m, const std::string& key,
                                      double fallback) {
  auto it = m.find(key);
  if (it == m.end()) return fallback;
  if (!it->is_number()) return KeyError(key, "must be a number");
  return it->get<double>();
}

std::optional<int64_t> OptionalId(const nlohmann::json& m, const std::string& key) {
  auto it = m.find(key);
  if (it == m.end() || !it->is_number_integer()) return std::nullopt;
  return it->get<int64_t>();
}

// Each GGUF layer tensor's HF name within model.layers.N.
const std::map<std::string, std::string>& LayerNames() {
  static const auto* names = new std::map<std::string, std::string>{
      {"attn_norm.weight", "input_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  return *names;
}

}  // namespace

absl::StatusOr<HfModelConfig> GgufLlamaConfig(const nlohmann::json& m, bool tied) {
  auto arch = m.find("general.architecture");
  if (arch == m.end() || !arch->is_string()) return KeyError("general.architecture", "missing");
  if (arch->get<std::string>() != "llama") {
    return KeyError("general.architecture",
                    absl::StrCat("\"", arch->get<std::string>(), "\" (supported: llama)"));
  }
  if (auto s = m.find("llama.rope.scaling.type");
      s != m.end() && !(s->is_string() && s->get<std::string>() == "none")) {
    return KeyError("llama.rope.scaling.type", "RoPE scaling is not imported");
  }
  HfModelConfig c;
  c.model_type = "llama";
  c.architectures = {"LlamaForCausalLM"};
  ASSIGN_OR_RETURN(c.hidden_size, RequiredInt(m, "llama.embedding_length"));
  ASSIGN_OR_RETURN(c.intermediate_size, RequiredInt(m, "llama.feed_forward_length"));
  ASSIGN_OR_RETURN(c.num_hidden_layers, RequiredInt(m, "llama.block_count"));
  ASSIGN_OR_RETURN(c.num_attention_heads, RequiredInt(m, "llama.attention.head_count"));
  c.num_key_value_heads = c.num_attention_heads;
  if (m.contains("llama.attention.head_count_kv")) {
    ASSIGN_OR_RETURN(c.num_key_value_heads, RequiredInt(m, "llama.attention.head_count_kv"));
  }
  c.head_dim = c.hidden_size / c.num_attention_heads;
  if (m.contains("llama.attention.key_length")) {
    ASSIGN_OR_RETURN(c.head_dim, RequiredInt(m, "llama.attention.key_length"));
  }
  ASSIGN_OR_RETURN(c.max_position_embeddings, RequiredInt(m, "llama.context_length"));
  if (m.contains("llama.vocab_size")) {
    ASSIGN_OR_RETURN(c.vocab_size, RequiredInt(m, "llama.vocab_size"));
  } else if (auto t = m.find("tokenizer.ggml.tokens"); t != m.end() && t->is_array()) {
    c.vocab_size = static_cast<int64_t>(t->size());
  } else {
    return KeyError("llama.vocab_size", "missing (and no tokenizer.ggml.tokens)");
  }
  ASSIGN_OR_RETURN(c.rope_theta, OptionalNumber(m, "llama.rope.freq_base", 10000.0));
  ASSIGN_OR_RETURN(c.rms_norm_eps,
                   OptionalNumber(m, "llama.attention.layer_norm_rms_epsilon", 1e-5));
  c.tie_word_embeddings = tied;
  c.torch_dtype = "float32";
  c.bos_token_id = OptionalId(m, "tokenizer.ggml.bos_token_id");
  if (auto eos = OptionalId(m, "tokenizer.ggml.eos_token_id")) c.eos_token_ids = {*eos};
  RETURN_IF_ERROR(Annotate(ValidateHfConfig(c), "config.json from GGUF metadata"));
  return c;
}

absl::StatusOr<std::string> GgufToHfName(const std::string& name) {
  if (name == "token_embd.weight") return std::string("model.embed_tokens.weight");
  if (name == "output_norm.weight") return std::string("model.norm.weight");
  if (name == "output.weight") return std::string("lm_head.weight");
  std::vector<std::string> parts = absl::StrSplit(name, absl::MaxSplits('.', 2));
  int64_t layer = 0;
  if (parts.size() == 3 && parts[0] == "blk" && absl::SimpleAtoi(parts[1], &layer) && layer >= 0) {
    auto it = LayerNames().find(parts[2]);
    if (it != LayerNames().end()) return absl::StrCat("model.layers.", layer, ".", it->second);
  }
  return absl::NotFoundError(absl::StrCat("GGUF tensor ", name, ": no Llama tensor of that name"));
}

void UnpermuteQk(std::vector<float>* rows, int64_t heads, int64_t head_dim, int64_t cols) {
  const std::vector<float> in = *rows;
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const float* src = &in[((h * head_dim) + i * 2 + j) * cols];
        float* dst = &(*rows)[((h * head_dim) + j * half + i) * cols];
        std::copy(src, src + cols, dst);
      }
    }
  }
}

absl::StatusOr<nlohmann::json> GgufTokenizerJson(const nlohmann::json& m) {
  const std::string model = m.value("tokenizer.ggml.model", "");
  if (model != "gpt2") {
    return KeyError("tokenizer.ggml.model",
                    absl::StrCat("\"", model, "\" (supported: gpt2, byte-level BPE)"));
  }
  auto tokens = m.find("tokenizer.ggml.tokens");
  auto merges = m.find("tokenizer.ggml.merges");
  if (tokens == m.end() || !tokens->is_array()) return KeyError("tokenizer.ggml.tokens", "missing");
  if (merges == m.end() || !merges->is_array()) return KeyError("tokenizer.ggml.merges", "missing");
  auto types = m.find("tokenizer.ggml.token_type");
  if (types != m.end() && (!types->is_array() || types->size() != tokens->size())) {
    return KeyError("tokenizer.ggml.token_type", "must list one type a token");
  }
  // The pre-tokenizer of each tokenizer.ggml.pre this importer knows.
  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", true},
                                     {"use_regex", true}};
  const std::string pre = m.value("tokenizer.ggml.pre", "default");
  nlohmann::json pre_tokenizer;
  if (pre == "smollm") {
    pre_tokenizer = {
        {"type", "Sequence"},
        {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, byte_level}}};
  } else if (pre == "gpt-2" || pre == "default") {
    pre_tokenizer = byte_level;
  } else {
    return KeyError("tokenizer.ggml.pre",
                    absl::StrCat("\"", pre, "\" (supported: smollm, gpt-2, default)"));
  }
  nlohmann::json vocab = nlohmann::json::object();
  nlohmann::json added = nlohmann::json::array();
  for (size_t id = 0; id < tokens->size(); ++id) {
    const nlohmann::json& token = (*tokens)[id];
    if (!token.is_string()) return KeyError("tokenizer.ggml.tokens", "must be strings");
    const std::string text = token.get<std::string>();
    if (vocab.contains(text)) {
      return KeyError("tokenizer.ggml.tokens", absl::StrCat("\"", text, "\" appears twice"));
    }
    vocab[text] = id;
    const int type = types == m.end() ? 1 : (*types)[id].get<int>();
    if (type == kTokenControl || type == kTokenUserDefined) {
      added.push_back({{"id", id},
                       {"content", text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", type == kTokenUserDefined},
                       {"special", type == kTokenControl}});
    }
  }
  nlohmann::json merge_list = nlohmann::json::array();
  for (const nlohmann::json& merge : *merges) {
    if (!merge.is_string()) return KeyError("tokenizer.ggml.merges", "must be strings");
    merge_list.push_back(merge);
  }
  return nlohmann::json{{"version", "1.0"},
                        {"truncation", nullptr},
                        {"padding", nullptr},
                        {"added_tokens", added},
                        {"normalizer", nullptr},
                        {"pre_tokenizer", pre_tokenizer},
                        {"post_processor",
                         {{"type", "ByteLevel"},
                          {"add_prefix_space", true},
                          {"trim_offsets", false},
                          {"use_regex", true}}},
                        {"decoder",
                         {{"type", "ByteLevel"},
                          {"add_prefix_space", true},
                          {"trim_offsets", true},
                          {"use_regex", true}}},
                        {"model",
                         {{"type", "BPE"},
                          {"dropout", nullptr},
                          {"unk_token", nullptr},
                          {"continuing_subword_prefix", nullptr},
                          {"end_of_word_suffix", nullptr},
                          {"fuse_unk", false},
                          {"byte_fallback", false},
                          {"ignore_merges", false},
                          {"vocab", vocab},
                          {"merges", merge_list}}}};
}

absl::StatusOr<nlohmann::json> GgufTokenizerConfig(const nlohmann::json& m) {
  auto tokens = m.find("tokenizer.ggml.tokens");
  if (tokens == m.end() || !tokens->is_array()) return KeyError("tokenizer.ggml.tokens", "missing");
  nlohmann::json config = {{"tokenizer_class", "GPT2Tokenizer"},
                           {"clean_up_tokenization_spaces", false},
                           {"add_bos_token", m.value("tokenizer.ggml.add_bos_token", false)},
                           {"model_max_length", m.value("llama.context_length", 0)}};
  const std::pair<const char*, const char*> ids[] = {
      {"bos_token", "tokenizer.ggml.bos_token_id"},
      {"eos_token", "tokenizer.ggml.eos_token_id"},
      {"unk_token", "tokenizer.ggml.unknown_token_id"},
      {"pad_token", "tokenizer.ggml.padding_token_id"}};
  for (const auto& [field, key] : ids) {
    const std::optional<int64_t> id = OptionalId(m, key);
    if (!id) continue;
    if (*id < 0 || *id >= static_cast<int64_t>(tokens->size())) {
      return KeyError(key, absl::StrCat(*id, " is not a token id"));
    }
    config[field] = (*tokens)[*id];
  }
  if (auto t = m.find("tokenizer.chat_template"); t != m.end()) {
    if (!t->is_string()) return KeyError("tokenizer.chat_template", "must be a string");
    config["chat_template"] = *t;
  }
  return config;
}

absl::Status ImportGguf(const GgufImportOptions& options) {
  if (options.gguf.empty()) return absl::InvalidArgumentError("--gguf: required");
  if (options.out.empty()) return absl::InvalidArgumentError("--out: required");
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(options.gguf));
  const nlohmann::json& m = file->metadata();
  ASSIGN_OR_RETURN(HfModelConfig config,
                   GgufLlamaConfig(m, file->Find("output.weight") == nullptr));
  ASSIGN_OR_RETURN(nlohmann::json tokenizer, GgufTokenizerJson(m));
  ASSIGN_OR_RETURN(nlohmann::json tokenizer_config, GgufTokenizerConfig(m));

  // The tensors the config asks for, with their HF shapes.
  const int64_t H = config.hidden_size, I = config.intermediate_size, D = config.head_dim;
  const int64_t A = config.num_attention_heads, KV = config.num_key_value_heads;
  std::map<std::string, std::vector<int64_t>> expected = {
      {"model.embed_tokens.weight", {config.vocab_size, H}}, {"model.norm.weight", {H}}};
  if (!config.tie_word_embeddings) expected["lm_head.weight"] = {config.vocab_size, H};
  for (int64_t l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    expected[p + "input_layernorm.weight"] = {H};
    expected[p + "post_attention_layernorm.weight"] = {H};
    expected[p + "self_attn.q_proj.weight"] = {A * D, H};
    expected[p + "self_attn.k_proj.weight"] = {KV * D, H};
    expected[p + "self_attn.v_proj.weight"] = {KV * D, H};
    expected[p + "self_attn.o_proj.weight"] = {H, A * D};
    expected[p + "mlp.gate_proj.weight"] = {I, H};
    expected[p + "mlp.up_proj.weight"] = {I, H};
    expected[p + "mlp.down_proj.weight"] = {H, I};
  }
  SafetensorsWriter writer;
  writer.SetMetadata("format", "pt");
  std::set<std::string> written;
  for (const GgufTensorInfo& t : file->tensors()) {
    if (t.name == "rope_freqs.weight") {
      return absl::InvalidArgumentError(
          absl::StrCat(options.gguf, ": tensor rope_freqs.weight (RoPE scaling) is not imported"));
    }
    absl::StatusOr<std::string> hf_name = GgufToHfName(t.name);
    if (!hf_name.ok()) return Annotate(hf_name.status(), options.gguf);
    const std::string& name = *hf_name;
    auto want = expected.find(name);
    if (want == expected.end()) {
      return absl::InvalidArgumentError(absl::StrCat(options.gguf, ": tensor ", t.name, " (", name,
                                                     ") is not part of this model's config"));
    }
    if (t.TorchShape() != want->second) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.gguf, ": tensor ", t.name, " has shape [", absl::StrJoin(t.TorchShape(), ", "),
          "], config.json asks [", absl::StrJoin(want->second, ", "), "]"));
    }
    ASSIGN_OR_RETURN(std::vector<float> values, file->Dequantize(t));
    if (absl::EndsWith(name, "q_proj.weight")) UnpermuteQk(&values, A, D, H);
    if (absl::EndsWith(name, "k_proj.weight")) UnpermuteQk(&values, KV, D, H);
    RETURN_IF_ERROR(
        writer.Add(name, DType::kF32, want->second, values.data(), values.size() * sizeof(float)));
    written.insert(name);
  }
  for (const auto& [name, shape] : expected) {
    if (written.count(name) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.gguf, ": no tensor for ", name, " (config.json needs it)"));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(options.out, ec);
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--out ", options.out, ": ", ec.message()));
  RETURN_IF_ERROR(writer.WriteFile(options.out + "/model.safetensors"));
  RETURN_IF_ERROR(WriteFileAtomically(options.out + "/tokenizer.json", tokenizer.dump() + "\n"));
  RETURN_IF_ERROR(
      WriteFileAtomically(options.out + "/tokenizer_config.json", tokenizer_config.dump(2) + "\n"));
  // config.json last: a directory with one is a complete checkpoint.
  return WriteFileAtomically(options.out + "/config.json", HfConfigToJson(config));
}

}  // namespace specstream::teacher
