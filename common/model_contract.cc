#include "common/model_contract.h"

#include "absl/strings/str_cat.h"

namespace specstream {
namespace {

absl::Status ModelFieldError(const std::string& where, const char* field, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(where, ".", field, ": ", why));
}

// A positive integer field.
absl::StatusOr<int64_t> PositiveField(const nlohmann::json& json, const std::string& where,
                                      const char* field) {
  auto it = json.find(field);
  if (it == json.end()) return ModelFieldError(where, field, "missing");
  if (!it->is_number_integer()) {
    return ModelFieldError(where, field, absl::StrCat("must be an integer, got ", it->dump()));
  }
  const int64_t value = it->get<int64_t>();
  if (value < 1)
    return ModelFieldError(where, field, absl::StrCat("must be positive, got ", value));
  return value;
}

}  // namespace

nlohmann::json ModelContract::ToJson() const {
  nlohmann::json json = {{"model_type", model_type},
                         {"hidden_size", hidden_size},
                         {"vocab_size", vocab_size},
                         {"num_layers", num_layers},
                         {"capture_layer_ids", capture_layer_ids}};
  if (!runtime.empty()) json["runtime"] = runtime;
  return json;
}

absl::StatusOr<ModelContract> ModelContract::FromJson(const nlohmann::json& json,
                                                      const std::string& where) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": must be an object, got ", json.is_null() ? "nothing" : json.dump()));
  }
  ModelContract contract;
  auto type = json.find("model_type");
  if (type == json.end() || !type->is_string() || type->get<std::string>().empty()) {
    return ModelFieldError(where, "model_type", "must be a non-empty string");
  }
  contract.model_type = type->get<std::string>();
  if (auto runtime = json.find("runtime"); runtime != json.end()) {
    if (!runtime->is_string()) return ModelFieldError(where, "runtime", "must be a string");
    contract.runtime = runtime->get<std::string>();
  }
  absl::StatusOr<int64_t> hidden = PositiveField(json, where, "hidden_size");
  if (!hidden.ok()) return hidden.status();
  absl::StatusOr<int64_t> vocab = PositiveField(json, where, "vocab_size");
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<int64_t> layers = PositiveField(json, where, "num_layers");
  if (!layers.ok()) return layers.status();
  contract.hidden_size = *hidden;
  contract.vocab_size = *vocab;
  contract.num_layers = *layers;
  auto ids = json.find("capture_layer_ids");
  if (ids == json.end() || !ids->is_array() || ids->empty()) {
    return ModelFieldError(where, "capture_layer_ids", "must be a non-empty list of layer ids");
  }
  for (size_t i = 0; i < ids->size(); ++i) {
    const nlohmann::json& id = (*ids)[i];
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= *layers) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".capture_layer_ids[", i,
                                                     "]: ", id.dump(), " is not a layer in [0, ",
                                                     *layers, ")"));
    }
    contract.capture_layer_ids.push_back(id.get<int>());
  }
  return contract;
}

std::string ModelContract::FirstDifference(const ModelContract& other) const {
  if (model_type != other.model_type) return "model_type";
  if (hidden_size != other.hidden_size) return "hidden_size";
  if (vocab_size != other.vocab_size) return "vocab_size";
  if (num_layers != other.num_layers) return "num_layers";
  if (capture_layer_ids != other.capture_layer_ids) return "capture_layer_ids";
  return "";
}

}  // namespace specstream
