#include "common/vocab_map.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/safetensors.h"
#include "common/status.h"

namespace specstream {

absl::Status TokenCounter::Add(absl::Span<const int32_t> ids, absl::Span<const uint8_t> mask) {
  if (!mask.empty() && mask.size() != ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss_mask has ", mask.size(), " entries but input_ids has ", ids.size()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= target_vocab()) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", ids[i], " at position ", i,
                                                     " is outside the target vocab [0, ",
                                                     target_vocab(), ")"));
    }
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    if (mask.empty() || mask[i] != 0) {
      ++counts_[ids[i]];
      ++total_;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<VocabMap> BuildVocabMap(const TokenCounter& counter, int64_t draft_vocab) {
  const int64_t target_vocab = counter.target_vocab();
  if (draft_vocab < 1 || draft_vocab > target_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft_vocab ", draft_vocab, " must be in [1, target vocab ", target_vocab, "]"));
  }
  const std::vector<int64_t>& counts = counter.counts();
  std::vector<int64_t> order(target_vocab);
  std::iota(order.begin(), order.end(), 0);
  // Most frequent first; ties and unseen ids (count 0) by ascending id, which
  // also pads with the smallest unseen ids.
  std::partial_sort(order.begin(), order.begin() + draft_vocab, order.end(),
                    [&](int64_t a, int64_t b) {
                      if (counts[a] != counts[b]) return counts[a] > counts[b];
                      return a < b;
                    });
  VocabMap map;
  map.used.assign(order.begin(), order.begin() + draft_vocab);
  std::sort(map.used.begin(), map.used.end());
  map.d2t.resize(draft_vocab);
  map.t2d.assign(target_vocab, 0);
  int64_t covered = 0;
  for (int64_t i = 0; i < draft_vocab; ++i) {
    map.d2t[i] = map.used[i] - i;
    map.t2d[map.used[i]] = 1;
    covered += counts[map.used[i]];
  }
  map.coverage = counter.total() > 0 ? static_cast<double>(covered) / counter.total() : 0.0;
  return map;
}

absl::Status SaveVocabMap(const VocabMap& map, const std::string& path) {
  SafetensorsWriter writer;
  RETURN_IF_ERROR(writer.Add("d2t", DType::kI64, {map.draft_vocab()}, map.d2t.data(),
                             map.d2t.size() * sizeof(int64_t)));
  RETURN_IF_ERROR(
      writer.Add("t2d", DType::kBool, {map.target_vocab()}, map.t2d.data(), map.t2d.size()));
  writer.SetMetadata("draft_vocab", std::to_string(map.draft_vocab()));
  writer.SetMetadata("target_vocab", std::to_string(map.target_vocab()));
  return writer.WriteFile(path);
}

absl::StatusOr<VocabMap> LoadVocabMap(const std::string& path) {
  ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
  ASSIGN_OR_RETURN(TensorView d2t, file->Get("d2t"));
  ASSIGN_OR_RETURN(TensorView t2d, file->Get("t2d"));
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("vocab map ", path, ": ", why));
  };
  if (d2t.dtype != DType::kI64 || d2t.shape.size() != 1)
    return bad("d2t must be I64 [draft_vocab]");
  if ((t2d.dtype != DType::kBool && t2d.dtype != DType::kU8) || t2d.shape.size() != 1) {
    return bad("t2d must be BOOL [target_vocab]");
  }
  VocabMap map;
  map.d2t.resize(d2t.shape[0]);
  std::copy_n(d2t.data, d2t.nbytes, reinterpret_cast<uint8_t*>(map.d2t.data()));
  map.t2d.assign(t2d.data, t2d.data + t2d.nbytes);
  int64_t previous = -1;
  for (int64_t i = 0; i < map.draft_vocab(); ++i) {
    int64_t target = map.d2t[i] + i;
    if (target <= previous || target >= map.target_vocab()) {
      return bad(absl::StrCat("d2t[", i, "] maps to target id ", target,
                              ", which is out of range or not increasing"));
    }
    if (map.t2d[target] == 0)
      return bad(absl::StrCat("t2d[", target, "] is unset but d2t uses it"));
    map.used.push_back(target);
    previous = target;
  }
  int64_t set = std::count_if(map.t2d.begin(), map.t2d.end(), [](uint8_t v) { return v != 0; });
  if (set != map.draft_vocab()) {
    return bad(absl::StrCat("t2d marks ", set, " ids but d2t has ", map.draft_vocab()));
  }
  return map;
}

}  // namespace specstream
