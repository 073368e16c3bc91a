#include "common/jobspec/job_spec.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/file.h"
#include "common/status.h"
#include "common/unicode.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/util/json_util.h"
#include "nlohmann/json.hpp"
#include "yaml-cpp/yaml.h"

namespace specstream::jobspec {

bool IsTrainingDevice(absl::string_view device) {
  if (device == "auto" || device == "cpu" || device == "cuda") return true;
  return absl::StartsWith(device, "cuda:") && device.size() > 5 &&
         device.find_first_not_of("0123456789", 5) == absl::string_view::npos;
}

namespace {

using ::specstream::v1::JobSpec;

absl::Status FieldError(absl::string_view field, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", reason));
}

std::string MarkText(const YAML::Mark& mark) {
  // yaml-cpp's marks are 0-based; editors count from 1.
  return absl::StrFormat("line %d, column %d", mark.line + 1, mark.column + 1);
}

// "line L, column C" of byte `offset` of `text` (1-based).
std::string PositionText(absl::string_view text, size_t offset) {
  const absl::string_view before = text.substr(0, offset);
  const size_t line_start = before.rfind('\n');
  return absl::StrFormat("line %d, column %d", std::count(before.begin(), before.end(), '\n') + 1,
                         offset - (line_start == absl::string_view::npos ? 0 : line_start + 1) + 1);
}

// The offset of the first control character YAML does not allow in a
// stream (C0 controls but tab, LF and CR; DEL), or text.size().
size_t FindControlCharacter(absl::string_view text) {
  for (size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7F) return i;
  }
  return text.size();
}

// A plain scalar that reads as a decimal number: sign, digits, at most one
// '.', an optional exponent. Keeps "inf", "nan", "0x10" and "1_000" strings
// (strtod would take the first three).
bool LooksNumeric(absl::string_view s) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  bool digits = false;
  bool dot = false;
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      digits = true;
    } else if (c == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return false;
  if (i == s.size()) return true;
  if (s[i] != 'e' && s[i] != 'E') return false;
  ++i;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  bool exp_digits = false;
  for (; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return false;
    exp_digits = true;
  }
  return exp_digits;
}

nlohmann::json ScalarToJson(const YAML::Node& node) {
  const std::string& text = node.Scalar();
  // "!" is yaml-cpp's tag for quoted scalars; an explicit !!str also means a
  // string. Only plain ("?") scalars are typed.
  if (node.Tag() != "?") return text;
  absl::string_view s = absl::StripAsciiWhitespace(text);
  int64_t i = 0;
  if (absl::SimpleAtoi(s, &i) && LooksNumeric(s)) return i;
  uint64_t u = 0;
  if (absl::SimpleAtoi(s, &u) && LooksNumeric(s)) return u;
  double d = 0;
  if (LooksNumeric(s) && absl::SimpleAtod(s, &d) && std::isfinite(d)) return d;
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return text;
}

// Nodes a spec may expand to. Aliases share nodes in yaml-cpp's graph but
// every use is expanded here, so a small document of nested aliases (an
// alias bomb) would otherwise grow without bound.
constexpr int64_t kMaxSpecNodes = 100000;
// How deep values may nest (the schema needs 3 levels). An alias inside its
// own anchor ("a: &x [*x]") is a cycle in yaml-cpp's graph, which would
// otherwise recurse here until the stack overflows.
constexpr int kMaxSpecDepth = 64;

absl::StatusOr<nlohmann::json> NodeToJson(const YAML::Node& node, const std::string& path,
                                          int depth, int64_t* budget) {
  if (--*budget < 0) {
    return absl::InvalidArgumentError(absl::StrCat("job spec YAML: ", MarkText(node.Mark()),
                                                   ": the spec expands to more than ",
                                                   kMaxSpecNodes, " values (nested aliases?)"));
  }
  if (depth > kMaxSpecDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec YAML: ", MarkText(node.Mark()), ": values nest more than ",
                     kMaxSpecDepth, " levels deep (an alias inside its own anchor?)"));
  }
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return nlohmann::json(nullptr);
    case YAML::NodeType::Scalar:
      return ScalarToJson(node);
    case YAML::NodeType::Sequence: {
      nlohmann::json array = nlohmann::json::array();
      size_t index = 0;
      for (const YAML::Node& item : node) {
        ASSIGN_OR_RETURN(
            nlohmann::json value,
            NodeToJson(item, absl::StrCat(path, "[", index++, "]"), depth + 1, budget));
        array.push_back(std::move(value));
      }
      return array;
    }
    case YAML::NodeType::Map: {
      nlohmann::json object = nlohmann::json::object();
      for (const auto& entry : node) {
        const YAML::Node& key = entry.first;
        if (!key.IsScalar()) {
          return absl::InvalidArgumentError(absl::StrCat("job spec YAML: ", MarkText(key.Mark()),
                                                         ": keys must be plain strings"));
        }
        std::string name = key.Scalar();
        std::string child = path.empty() ? name : absl::StrCat(path, ".", name);
        if (object.contains(name)) {
          return absl::InvalidArgumentError(absl::StrCat("job spec YAML: ", MarkText(key.Mark()),
                                                         ": duplicate key \"", child, "\""));
        }
        ASSIGN_OR_RETURN(object[name], NodeToJson(entry.second, child, depth + 1, budget));
      }
      return object;
    }
  }
  return nlohmann::json(nullptr);
}

absl::Status RequirePositive(int64_t value, absl::string_view field) {
  if (value <= 0) return FieldError(field, absl::StrCat("must be > 0, got ", value));
  return absl::OkStatus();
}

absl::Status RequireNonNegative(int64_t value, absl::string_view field) {
  if (value < 0) return FieldError(field, absl::StrCat("must be >= 0, got ", value));
  return absl::OkStatus();
}

// In [0, max]: checked before any narrowing (credits are 32-bit, stored
// counts 32-bit), so a huge value is refused instead of wrapping.
absl::Status RequireAtMost(int64_t value, int64_t max, absl::string_view field) {
  if (value < 0 || value > max) {
    return FieldError(field, absl::StrCat("must be in [0, ", max, "], got ", value));
  }
  return absl::OkStatus();
}

absl::Status RequireNonNegative(double value, absl::string_view field) {
  if (!(value >= 0)) return FieldError(field, absl::StrCat("must be >= 0, got ", value));
  return absl::OkStatus();
}

// Exactly one of two alternatives is set. "Neither" names the first field,
// "both" the second (the one to drop, usually).
absl::Status ExactlyOneSet(bool a, absl::string_view a_name, bool b, absl::string_view b_name) {
  if (!a && !b) return FieldError(a_name, absl::StrCat("required (or set ", b_name, " instead)"));
  if (a && b) return FieldError(b_name, absl::StrCat("set together with ", a_name, "; set one"));
  return absl::OkStatus();
}

// Exactly one of two "0 means unset" counts is set (> 0); neither may be
// negative.
absl::Status ExactlyOne(int64_t a, absl::string_view a_name, int64_t b, absl::string_view b_name) {
  RETURN_IF_ERROR(RequireNonNegative(a, a_name));
  RETURN_IF_ERROR(RequireNonNegative(b, b_name));
  return ExactlyOneSet(a > 0, a_name, b > 0, b_name);
}

absl::Status ValidateData(v1::DataSpec& data) {
  // Online jobs name their teachers, or leave them to the coordinator, which
  // assigns live teachers serving model.target.
  if (!data.store().empty() && !data.tokenized().empty()) {
    return FieldError("data.tokenized", "set together with data.store; set one");
  }
  const bool online = !data.tokenized().empty() || !data.teachers().empty();
  if (data.store().empty() == !online) {
    return FieldError("data.store",
                      "set exactly one of data.store (offline) and data.tokenized (online)");
  }
  if (!data.teachers().empty() && data.tokenized().empty()) {
    return FieldError("data.tokenized", "required with data.teachers (pre-tokenized JSONL)");
  }
  for (int i = 0; i < data.teachers_size(); ++i) {
    if (data.teachers(i).find(':') == std::string::npos) {
      return FieldError(absl::StrCat("data.teachers[", i, "]"),
                        absl::StrCat("\"", data.teachers(i), "\" is not host:port"));
    }
  }
  if (data.transport().empty()) data.set_transport("auto");
  if (data.transport() != "auto" && data.transport() != "inline" && data.transport() != "shm" &&
      data.transport() != "nccl") {
    return FieldError("data.transport",
                      absl::StrCat("\"", data.transport(), "\" is not auto, inline, shm or nccl"));
  }
  RETURN_IF_ERROR(RequireAtMost(data.in_flight(), kMaxInFlight, "data.in_flight"));
  if (data.in_flight() == 0) data.set_in_flight(kDefaultInFlight);
  if (!data.has_teacher_grace_s()) data.set_teacher_grace_s(kDefaultTeacherGraceSeconds);
  if (!(data.teacher_grace_s() >= 0) || data.teacher_grace_s() > kMaxTeacherGraceSeconds) {
    return FieldError("data.teacher_grace_s",
                      absl::StrCat("must be in [0, ", kMaxTeacherGraceSeconds, "] seconds, got ",
                                   data.teacher_grace_s()));
  }
  if (data.has_regenerate()) {
    v1::RegenerateSpec& regenerate = *data.mutable_regenerate();
    if (!online) {
      return FieldError("data.regenerate", "regeneration is online only (data.tokenized)");
    }
    RETURN_IF_ERROR(
        RequireNonNegative(regenerate.max_new_tokens(), "data.regenerate.max_new_tokens"));
    if (regenerate.max_new_tokens() == 0) regenerate.set_max_new_tokens(kDefaultRegenerateTokens);
    if (!(regenerate.temperature() >= 0) || !std::isfinite(regenerate.temperature())) {
      return FieldError(
          "data.regenerate.temperature",
          absl::StrCat("must be finite and >= 0 (0: greedy), got ", regenerate.temperature()));
    }
  }
  return RequireNonNegative(data.max_length(), "data.max_length");
}

bool IsBlockDraft(const v1::DraftSpec& draft) {
  return draft.type() == kDraftTypeDflash || draft.type() == kDraftTypeDspark;
}

// Whether a field a draft type does not take is set ("set": non-zero,
// non-empty, present), by its name under model.draft.
struct SetField {
  absl::string_view name;
  bool set;
};

// The fields of both block drafts.
std::vector<SetField> BlockDraftFieldsSet(const v1::DraftSpec& draft) {
  return {{"num_layers", draft.num_layers() != 0},
          {"block_size", draft.block_size() != 0},
          {"num_anchors", draft.num_anchors() != 0},
          {"mask_token_id", draft.has_mask_token_id()},
          {"target_layer_ids", draft.target_layer_ids_size() > 0},
          {"loss_decay_gamma", draft.has_loss_decay_gamma()}};
}

// The fields of DSpark's Markov and confidence heads and its loss.
std::vector<SetField> DsparkFieldsSet(const v1::DraftSpec& draft) {
  return {{"markov_rank", draft.markov_rank() != 0},
          {"markov_head_type", !draft.markov_head_type().empty()},
          {"enable_confidence_head", draft.has_enable_confidence_head()},
          {"confidence_head_with_markov", draft.has_confidence_head_with_markov()},
          {"loss_weights", draft.has_loss_weights()}};
}

// P-EAGLE's COD shares.
std::vector<SetField> PeagleFieldsSet(const v1::DraftSpec& draft) {
  return {{"down_sample_ratio", draft.has_down_sample_ratio()},
          {"down_sample_ratio_min", draft.has_down_sample_ratio_min()}};
}

// EAGLE 3.1's flags on the EAGLE-3 draft.
std::vector<SetField> Eagle31FieldsSet(const v1::DraftSpec& draft) {
  return {{"fc_norm", draft.fc_norm()},
          {"norm_output", draft.norm_output()},
          {"norm_before_fc", draft.norm_before_fc()}};
}

// In [min, max]; the message names the range.
absl::Status RequireInRange(int64_t value, int64_t min, int64_t max, absl::string_view field) {
  if (value < min || value > max) {
    return FieldError(field, absl::StrCat("must be in [", min, ", ", max, "], got ", value));
  }
  return absl::OkStatus();
}

absl::Status RequireFiniteNonNegative(double value, absl::string_view field) {
  if (!(value >= 0) || !std::isfinite(value)) {
    return FieldError(field, absl::StrCat("must be finite and >= 0, got ", value));
  }
  return absl::OkStatus();
}

// DSpark's heads and loss weights. The confidence head and its weight agree
// (as DeepSpec ties them: the head is on iff its weight is > 0): unset, the
// head is on unless loss_weights.conf is 0, and conf is 1.0 with the head,
// 0 without. confidence_head_with_markov follows the head when unset (the
// public DSpark recipes and DESIGN §10 feed [h_k ; W1[prev_k]]).
absl::Status ValidateDsparkHeads(v1::DraftSpec& draft) {
  if (draft.markov_rank() == 0) draft.set_markov_rank(kDefaultMarkovRank);
  RETURN_IF_ERROR(
      RequireInRange(draft.markov_rank(), 1, kMaxMarkovRank, "model.draft.markov_rank"));
  if (draft.markov_head_type().empty()) draft.set_markov_head_type(kDefaultMarkovHeadType);
  const std::string& head = draft.markov_head_type();
  if (head == "gated" || head == "rnn") {
    return FieldError("model.draft.markov_head_type",
                      absl::StrCat("\"", head, "\" is not built yet (built: vanilla)"));
  }
  if (head != kDefaultMarkovHeadType) {
    return FieldError("model.draft.markov_head_type",
                      absl::StrCat("unknown head type \"", head,
                                   "\" (known: vanilla; gated and rnn are not built yet)"));
  }

  v1::DraftLossWeights& weights = *draft.mutable_loss_weights();
  if (!draft.has_enable_confidence_head()) {
    draft.set_enable_confidence_head(!(weights.has_conf() && weights.conf() == 0));
  }
  const bool confidence = draft.enable_confidence_head();
  if (!weights.has_ce()) weights.set_ce(kDefaultCeLossWeight);
  if (!weights.has_l1()) weights.set_l1(kDefaultL1LossWeight);
  if (!weights.has_conf()) weights.set_conf(confidence ? kDefaultConfLossWeight : 0);
  RETURN_IF_ERROR(RequireFiniteNonNegative(weights.ce(), "model.draft.loss_weights.ce"));
  RETURN_IF_ERROR(RequireFiniteNonNegative(weights.l1(), "model.draft.loss_weights.l1"));
  RETURN_IF_ERROR(RequireFiniteNonNegative(weights.conf(), "model.draft.loss_weights.conf"));
  if (confidence && weights.conf() == 0) {
    return FieldError("model.draft.loss_weights.conf",
                      "must be > 0 with enable_confidence_head true (the head would be exported "
                      "untrained); set enable_confidence_head false for no head");
  }
  if (!confidence && weights.conf() > 0) {
    return FieldError("model.draft.loss_weights.conf",
                      absl::StrCat("must be 0 with enable_confidence_head false (there is no "
                                   "head to train), got ",
                                   weights.conf()));
  }
  if (weights.ce() == 0 && weights.l1() == 0 && weights.conf() == 0) {
    return FieldError("model.draft.loss_weights", "at least one of ce, l1, conf must be > 0");
  }
  if (!draft.has_confidence_head_with_markov()) {
    draft.set_confidence_head_with_markov(confidence);
  }
  if (draft.confidence_head_with_markov() && !confidence) {
    return FieldError("model.draft.confidence_head_with_markov",
                      "true without a confidence head (enable_confidence_head is false)");
  }
  return absl::OkStatus();
}

// dflash / dspark: the block-draft fields, defaults per type (DESIGN §10).
absl::Status ValidateBlockDraft(v1::DraftSpec& draft) {
  const bool dspark = draft.type() == kDraftTypeDspark;
  for (const SetField& field : Eagle31FieldsSet(draft)) {
    if (field.set) {
      return FieldError(absl::StrCat("model.draft.", field.name),
                        absl::StrCat("only for eagle3 drafts (EAGLE 3.1; model.draft.type is ",
                                     draft.type(), ")"));
    }
  }
  // These drafts predict with the target's full-vocab lm_head.
  if (draft.draft_vocab_size() != 0 || !draft.vocab_map().empty()) {
    return FieldError(
        draft.draft_vocab_size() != 0 ? "model.draft.draft_vocab_size" : "model.draft.vocab_map",
        absl::StrCat("only for eagle3 drafts (", draft.type(),
                     " drafts use the target's full-vocab lm_head)"));
  }
  if (!dspark) {
    for (const SetField& field : DsparkFieldsSet(draft)) {
      if (field.set) {
        return FieldError(absl::StrCat("model.draft.", field.name),
                          "only for dspark drafts (model.draft.type is dflash)");
      }
    }
  }

  if (draft.num_layers() == 0) draft.set_num_layers(kDefaultBlockDraftLayers);
  RETURN_IF_ERROR(
      RequireInRange(draft.num_layers(), 1, kMaxBlockDraftLayers, "model.draft.num_layers"));

  if (draft.block_size() == 0) {
    draft.set_block_size(dspark ? kDefaultDsparkBlockSize : kDefaultDflashBlockSize);
  }
  // DFlash's slot 0 holds the anchor token and is never trained, so a block
  // of one predicts nothing; DSpark trains every slot.
  if (!dspark && draft.block_size() < 2) {
    return FieldError(
        "model.draft.block_size",
        absl::StrCat("must be >= 2 for dflash (slot 0 is untrained), got ", draft.block_size()));
  }
  RETURN_IF_ERROR(
      RequireInRange(draft.block_size(), dspark ? 1 : 2, kMaxBlockSize, "model.draft.block_size"));

  if (draft.num_anchors() == 0) draft.set_num_anchors(kDefaultNumAnchors);
  RETURN_IF_ERROR(
      RequireInRange(draft.num_anchors(), 1, kMaxNumAnchors, "model.draft.num_anchors"));

  if (draft.has_mask_token_id()) {
    RETURN_IF_ERROR(RequireNonNegative(draft.mask_token_id(), "model.draft.mask_token_id"));
  }

  // The upper bound (the target's layer count) is checked at start.
  for (int i = 0; i < draft.target_layer_ids_size(); ++i) {
    const std::string field = absl::StrCat("model.draft.target_layer_ids[", i, "]");
    RETURN_IF_ERROR(RequireNonNegative(draft.target_layer_ids(i), field));
    if (i > 0 && draft.target_layer_ids(i) <= draft.target_layer_ids(i - 1)) {
      return FieldError(
          field, absl::StrCat("must be > the id before it (ascending and distinct), "
                              "got ",
                              draft.target_layer_ids(i), " after ", draft.target_layer_ids(i - 1)));
    }
  }

  if (!draft.has_loss_decay_gamma()) {
    draft.set_loss_decay_gamma(dspark ? kDefaultDsparkLossDecayGamma
                                      : kDefaultDflashLossDecayGamma);
  }
  if (!(draft.loss_decay_gamma() > 0) || !std::isfinite(draft.loss_decay_gamma())) {
    return FieldError("model.draft.loss_decay_gamma",
                      absl::StrCat("must be > 0 and finite, got ", draft.loss_decay_gamma()));
  }

  if (dspark) RETURN_IF_ERROR(ValidateDsparkHeads(draft));
  return absl::OkStatus();
}

absl::Status ValidateModel(v1::ModelSpec& model) {
  if (model.target().empty()) {
    return FieldError("model.target", "required (target checkpoint directory)");
  }
  v1::DraftSpec& draft = *model.mutable_draft();
  RETURN_IF_ERROR(RequireNonNegative(draft.hidden_size(), "model.draft.hidden_size"));
  RETURN_IF_ERROR(RequireNonNegative(draft.intermediate_size(), "model.draft.intermediate_size"));
  RETURN_IF_ERROR(
      RequireNonNegative(draft.num_attention_heads(), "model.draft.num_attention_heads"));
  RETURN_IF_ERROR(
      RequireNonNegative(draft.num_key_value_heads(), "model.draft.num_key_value_heads"));
  RETURN_IF_ERROR(RequireNonNegative(draft.head_dim(), "model.draft.head_dim"));
  if (draft.num_attention_heads() > 0 && draft.num_key_value_heads() > 0 &&
      draft.num_attention_heads() % draft.num_key_value_heads() != 0) {
    return FieldError("model.draft.num_key_value_heads",
                      absl::StrCat("must divide num_attention_heads (", draft.num_attention_heads(),
                                   "), got ", draft.num_key_value_heads()));
  }
  if (draft.type().empty()) draft.set_type(kDraftTypeEagle3);
  const bool peagle = draft.type() == kDraftTypePeagle;
  if (draft.type() != kDraftTypeEagle3 && !peagle && !IsBlockDraft(draft)) {
    return FieldError("model.draft.type",
                      absl::StrCat("unknown draft type \"", draft.type(),
                                   "\" (known: eagle3, peagle, dflash, dspark)"));
  }
  for (const SetField& field : PeagleFieldsSet(draft)) {
    if (field.set && !peagle) {
      return FieldError(
          absl::StrCat("model.draft.", field.name),
          absl::StrCat("only for peagle drafts (model.draft.type is ", draft.type(), ")"));
    }
  }
  if (IsBlockDraft(draft)) return ValidateBlockDraft(draft);

  for (const SetField& field : BlockDraftFieldsSet(draft)) {
    // P-EAGLE's depths >= 1 read a mask token too.
    const bool mask = field.name == "mask_token_id";
    if (field.set && !(peagle && mask)) {
      return FieldError(
          absl::StrCat("model.draft.", field.name),
          absl::StrCat("only for ", mask ? "peagle, " : "",
                       "dflash and dspark drafts (model.draft.type is ", draft.type(), ")"));
    }
  }
  for (const SetField& field : DsparkFieldsSet(draft)) {
    if (field.set) {
      return FieldError(
          absl::StrCat("model.draft.", field.name),
          absl::StrCat("only for dspark drafts (model.draft.type is ", draft.type(), ")"));
    }
  }
  if (draft.has_mask_token_id()) {
    RETURN_IF_ERROR(RequireNonNegative(draft.mask_token_id(), "model.draft.mask_token_id"));
  }
  if (draft.has_down_sample_ratio() &&
      !(draft.down_sample_ratio() > 0 && draft.down_sample_ratio() < 1)) {
    return FieldError("model.draft.down_sample_ratio",
                      absl::StrCat("must be in (0, 1), got ", draft.down_sample_ratio()));
  }
  if (draft.has_down_sample_ratio_min() &&
      !(draft.down_sample_ratio_min() >= 0 && draft.down_sample_ratio_min() <= 1)) {
    return FieldError("model.draft.down_sample_ratio_min",
                      absl::StrCat("must be in [0, 1], got ", draft.down_sample_ratio_min()));
  }
  if (draft.fc_norm() && draft.norm_before_fc()) {
    return FieldError("model.draft.fc_norm",
                      "true together with model.draft.norm_before_fc: the captures are "
                      "normalised per layer (fc_norm) or over their concatenation "
                      "(norm_before_fc), not both");
  }
  RETURN_IF_ERROR(RequireNonNegative(draft.draft_vocab_size(), "model.draft.draft_vocab_size"));
  bool has_size = draft.draft_vocab_size() > 0;
  bool has_map = !draft.vocab_map().empty();
  return ExactlyOneSet(has_size, "model.draft.draft_vocab_size", has_map, "model.draft.vocab_map");
}

absl::Status ValidateOptimizer(v1::OptimizerSpec& opt) {
  if (!(opt.lr() > 0) || !std::isfinite(opt.lr())) {
    return FieldError("optimizer.lr", absl::StrCat("must be > 0, got ", opt.lr()));
  }
  if (opt.betas_size() == 0) {
    opt.add_betas(kDefaultBeta1);
    opt.add_betas(kDefaultBeta2);
  }
  if (opt.betas_size() != 2) {
    return FieldError("optimizer.betas",
                      absl::StrCat("must be two values [beta1, beta2], got ", opt.betas_size()));
  }
  for (int i = 0; i < 2; ++i) {
    double beta = opt.betas(i);
    if (!(beta >= 0 && beta < 1)) {
      return FieldError(absl::StrCat("optimizer.betas[", i, "]"),
                        absl::StrCat("must be in [0, 1), got ", beta));
    }
  }
  if (opt.eps() == 0) opt.set_eps(kDefaultEps);
  if (!(opt.eps() > 0)) {
    return FieldError("optimizer.eps", absl::StrCat("must be > 0, got ", opt.eps()));
  }
  RETURN_IF_ERROR(RequireNonNegative(opt.weight_decay(), "optimizer.weight_decay"));
  RETURN_IF_ERROR(RequireNonNegative(opt.grad_clip(), "optimizer.grad_clip"));
  RETURN_IF_ERROR(RequireNonNegative(opt.warmup_steps(), "optimizer.warmup_steps"));
  if (!(opt.warmup_ratio() >= 0 && opt.warmup_ratio() < 1)) {
    return FieldError("optimizer.warmup_ratio",
                      absl::StrCat("must be in [0, 1), got ", opt.warmup_ratio()));
  }
  if (opt.warmup_steps() > 0 && opt.warmup_ratio() > 0) {
    return FieldError("optimizer.warmup_ratio",
                      "set together with optimizer.warmup_steps; set at most one");
  }
  if (opt.schedule().empty()) opt.set_schedule(kDefaultSchedule);
  if (opt.schedule() != "cosine" && opt.schedule() != "constant") {
    return FieldError("optimizer.schedule", absl::StrCat("unknown schedule \"", opt.schedule(),
                                                         "\" (known: cosine, constant)"));
  }
  if (!(opt.min_lr_ratio() >= 0 && opt.min_lr_ratio() <= 1)) {
    return FieldError("optimizer.min_lr_ratio",
                      absl::StrCat("must be in [0, 1], got ", opt.min_lr_ratio()));
  }
  return absl::OkStatus();
}

// `draft` is validated (its type filled in).
absl::Status ValidateTraining(v1::TrainingSpec& training, const v1::DraftSpec& draft) {
  RETURN_IF_ERROR(
      ExactlyOne(training.epochs(), "training.epochs", training.max_steps(), "training.max_steps"));
  RETURN_IF_ERROR(ExactlyOne(training.batch_size(), "training.batch_size", training.batch_tokens(),
                             "training.batch_tokens"));
  // TTT unrolls EAGLE-3's draft; a block draft predicts a whole block in one
  // forward, so it has no K (and the field stays 0).
  if (IsBlockDraft(draft)) {
    if (training.ttt_steps() != 0) {
      return FieldError("training.ttt_steps", absl::StrCat("only for eagle3 drafts "
                                                           "(model.draft.type is ",
                                                           draft.type(), ")"));
    }
  } else {
    if (training.ttt_steps() == 0) training.set_ttt_steps(kDefaultTttSteps);
    if (training.ttt_steps() < 1 || training.ttt_steps() > kMaxTttSteps) {
      return FieldError("training.ttt_steps", absl::StrCat("must be in [1, ", kMaxTttSteps,
                                                           "], got ", training.ttt_steps()));
    }
  }
  if (training.dtype().empty()) training.set_dtype(kDefaultDtype);
  if (training.dtype() != "float32" && training.dtype() != "bfloat16") {
    return FieldError("training.dtype", absl::StrCat("unknown dtype \"", training.dtype(),
                                                     "\" (known: float32, bfloat16)"));
  }
  if (training.log_every() == 0) training.set_log_every(kDefaultLogEvery);
  RETURN_IF_ERROR(RequirePositive(training.log_every(), "training.log_every"));
  RETURN_IF_ERROR(RequireAtMost(training.max_bad_steps(), kMaxBadSteps, "training.max_bad_steps"));
  if (training.device().empty()) training.set_device("auto");
  if (!IsTrainingDevice(training.device())) {
    return FieldError("training.device", absl::StrCat("unknown device \"", training.device(),
                                                      "\" (known: auto, cpu, cuda, cuda:N)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateCheckpoint(const v1::CheckpointSpec& checkpoint) {
  RETURN_IF_ERROR(RequireNonNegative(checkpoint.every_steps(), "checkpoint.every_steps"));
  RETURN_IF_ERROR(RequireAtMost(checkpoint.keep_last(), kMaxKeepLast, "checkpoint.keep_last"));
  if (checkpoint.dir().empty() && (checkpoint.every_steps() > 0 || checkpoint.keep_last() > 0)) {
    return FieldError(
        checkpoint.every_steps() > 0 ? "checkpoint.every_steps" : "checkpoint.keep_last",
        "set without checkpoint.dir");
  }
  return absl::OkStatus();
}

constexpr double kDefaultRendezvousTimeoutSeconds = 120;

absl::Status ValidateParallel(v1::ParallelSpec& parallel) {
  if (parallel.cp_size() == 0) parallel.set_cp_size(kDefaultCpSize);
  if (parallel.cp_size() < 1) {
    return FieldError("parallel.cp_size", absl::StrCat("must be >= 1, got ", parallel.cp_size()));
  }
  if (parallel.cp_mode().empty()) parallel.set_cp_mode(kDefaultCpMode);
  const std::string& mode = parallel.cp_mode();
  if (mode != "ring" && mode != "ulysses" && mode != "usp") {
    return FieldError("parallel.cp_mode",
                      absl::StrCat("unknown mode \"", mode, "\" (known: ring, ulysses, usp)"));
  }
  int64_t degree = parallel.ulysses_degree();
  RETURN_IF_ERROR(RequireNonNegative(degree, "parallel.ulysses_degree"));
  if (mode == "ring") {
    if (degree > 1) {
      return FieldError("parallel.ulysses_degree",
                        absl::StrCat("is ", degree, " but cp_mode is ring (use usp)"));
    }
  } else if (mode == "ulysses") {
    if (degree == 0) parallel.set_ulysses_degree(parallel.cp_size());
    if (parallel.ulysses_degree() != parallel.cp_size()) {
      return FieldError("parallel.ulysses_degree",
                        absl::StrCat("must equal cp_size (", parallel.cp_size(),
                                     ") under cp_mode ulysses, got ", degree));
    }
  } else {  // usp
    if (degree == 0) return FieldError("parallel.ulysses_degree", "required when cp_mode is usp");
  }
  if (parallel.ulysses_degree() > 0 && parallel.cp_size() % parallel.ulysses_degree() != 0) {
    return FieldError("parallel.ulysses_degree",
                      absl::StrCat("must divide cp_size (", parallel.cp_size(), "), got ",
                                   parallel.ulysses_degree()));
  }
  RETURN_IF_ERROR(RequireNonNegative(parallel.dp_size(), "parallel.dp_size"));
  if (!(parallel.rendezvous_timeout_s() >= 0) || parallel.rendezvous_timeout_s() > 86400) {
    return FieldError(
        "parallel.rendezvous_timeout_s",
        absl::StrCat("must be in [0, 86400] seconds, got ", parallel.rendezvous_timeout_s()));
  }
  if (parallel.rendezvous_timeout_s() == 0) {
    parallel.set_rendezvous_timeout_s(kDefaultRendezvousTimeoutSeconds);
  }
  if (parallel.dp_size() > kMaxWorldSize || parallel.cp_size() > kMaxWorldSize ||
      parallel.dp_size() * parallel.cp_size() > kMaxWorldSize) {
    return FieldError("parallel.dp_size",
                      absl::StrCat("dp_size x cp_size must be <= ", kMaxWorldSize, ", got ",
                                   parallel.dp_size(), " x ", parallel.cp_size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> JobYamlToJson(absl::string_view yaml_text) {
  if (yaml_text.size() > kMaxSpecBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job spec: ", yaml_text.size(),
                                                   " bytes, more than the limit of ", kMaxSpecBytes,
                                                   " bytes"));
  }
  // JSON (and the proto schema) hold UTF-8 only: refuse anything else here,
  // naming where, instead of failing later inside a serialiser. Control
  // characters YAML does not allow are refused too: yaml-cpp mishandles them
  // (it reads "x\0_y" as "x", 0xA0, "y", which is not UTF-8).
  const size_t bad_utf8 = unicode::FindInvalidUtf8(yaml_text);
  const size_t control = FindControlCharacter(yaml_text);
  if (const size_t bad = std::min(bad_utf8, control); bad < yaml_text.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "job spec YAML: %s: %s (byte 0x%02x)", PositionText(yaml_text, bad),
        bad == control ? "a control character (YAML allows tab, LF and CR only)" : "invalid UTF-8",
        static_cast<unsigned char>(yaml_text[bad])));
  }
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec YAML: ", MarkText(e.mark), ": ", e.msg));
  }
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        root.IsNull() ? "job spec YAML: empty document"
                      : absl::StrCat("job spec YAML: ", MarkText(root.Mark()),
                                     ": the top level must be a map of sections"));
  }
  try {
    int64_t budget = kMaxSpecNodes;
    ASSIGN_OR_RETURN(nlohmann::json json, NodeToJson(root, "", /*depth=*/0, &budget));
    return json.dump();
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec YAML: ", MarkText(e.mark), ": ", e.msg));
  } catch (const nlohmann::json::exception& e) {
    // dump() throws on a string that is not UTF-8; none should get here (the
    // text is checked above), but a spec is refused, never a crash.
    return absl::InvalidArgumentError(absl::StrCat("job spec YAML: ", e.what()));
  }
}

absl::StatusOr<JobSpec> ParseJobSpecYaml(absl::string_view yaml_text) {
  ASSIGN_OR_RETURN(std::string json, JobYamlToJson(yaml_text));
  JobSpec spec;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  auto parsed = google::protobuf::util::JsonStringToMessage(json, &spec, options);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: ", std::string(parsed.message().data(), parsed.message().size())));
  }
  RETURN_IF_ERROR(ValidateJobSpec(spec));
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpec(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  auto spec = ParseJobSpecYaml(text);
  if (!spec.ok()) return Annotate(spec.status(), path);
  return spec;
}

absl::Status ValidateJobSpec(JobSpec& spec) {
  RETURN_IF_ERROR(ValidateData(*spec.mutable_data()));
  RETURN_IF_ERROR(ValidateModel(*spec.mutable_model()));
  RETURN_IF_ERROR(ValidateOptimizer(*spec.mutable_optimizer()));
  const v1::DraftSpec& draft = spec.model().draft();
  RETURN_IF_ERROR(ValidateTraining(*spec.mutable_training(), draft));
  RETURN_IF_ERROR(ValidateCheckpoint(spec.checkpoint()));
  RETURN_IF_ERROR(ValidateParallel(*spec.mutable_parallel()));
  if (!spec.has_max_restarts()) spec.set_max_restarts(kDefaultMaxRestarts);
  RETURN_IF_ERROR(RequireAtMost(spec.max_restarts(), kMaxRestarts, "max_restarts"));
  return absl::OkStatus();
}

std::string JobSpecFingerprint(const JobSpec& spec) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    spec.SerializeToCodedStream(&coded);
  }
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  return absl::StrFormat("%016x", hash);
}

}  // namespace specstream::jobspec
