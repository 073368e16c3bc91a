// Where training samples come from. The offline store is the first source;
// live teacher streams (a later issue) implement the same interface, so the
// trainer does not care which one feeds it.
//
// Thread-safety: Get() may be called from one thread at a time per source.
#ifndef SPECSTREAM_STUDENT_DATA_SOURCE_H_
#define SPECSTREAM_STUDENT_DATA_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "absl/status/statusor.h"
#include "common/offline_store.h"
#include "nlohmann/json.hpp"
#include "student/draft_model.h"

namespace specstream::student {

// One sample's tensors (owned copies), T tokens.
struct TrainingSample {
  int64_t id = 0;
  torch::Tensor input_ids;    // [T] int64
  torch::Tensor loss_mask;    // [T] uint8
  torch::Tensor aux_hidden;   // [T, C·Ht]
  torch::Tensor last_hidden;  // [T, Ht]
  torch::Tensor target_ids;   // [T] int64, or undefined
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  // The index-th sample (0 <= index < size()).
  virtual absl::StatusOr<TrainingSample> Get(int64_t index) = 0;
  // The model contract the samples were produced under (store index.json's).
  virtual const nlohmann::json& contract() const = 0;
  // Token count of the index-th sample, without reading its tensors.
  virtual int64_t Length(int64_t index) const = 0;
};

class StoreSource final : public SampleSource {
 public:
  static absl::StatusOr<std::unique_ptr<StoreSource>> Open(const std::string& dir);
  int64_t size() const override { return reader_->num_samples(); }
  absl::StatusOr<TrainingSample> Get(int64_t index) override;
  const nlohmann::json& contract() const override { return reader_->contract(); }
  int64_t Length(int64_t index) const override { return lengths_[index]; }
  bool has_target_ids() const { return has_target_ids_; }
  const StoreReader& reader() const { return *reader_; }

 private:
  std::unique_ptr<StoreReader> reader_;
  std::vector<int64_t> lengths_;
  bool has_target_ids_ = false;
};

// Right-pads samples into one batch, truncating each to max_length (0: off).
DraftBatch Collate(const std::vector<TrainingSample>& samples, int64_t max_length);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_DATA_SOURCE_H_
