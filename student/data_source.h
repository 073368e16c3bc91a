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
#include "common/model_contract.h"
#include "common/offline_store.h"
#include "nlohmann/json.hpp"
#include "student/draft_model.h"

namespace specstream::student {

// One sample's tensors (owned copies): rows [offset, offset + rows) of a
// sample of `length` tokens (the whole sample unless read with GetRows).
struct TrainingSample {
  int64_t id = 0;
  int64_t offset = 0;         // position of row 0 within the sample
  int64_t length = 0;         // the whole sample's token count
  torch::Tensor input_ids;    // [R] int64
  torch::Tensor loss_mask;    // [R] uint8
  torch::Tensor aux_hidden;   // [Ra, C·Ht], Ra <= R (see RowRange)
  torch::Tensor last_hidden;  // [R, Ht]
  torch::Tensor target_ids;   // [R] int64, or undefined
};

// Which rows of a sample a context-parallel rank reads: aux_hidden rows
// [begin, end), the per-token tensors (ids, mask, last_hidden, target_ids)
// rows [begin, halo_end) — the shard plus the TTT halo. Both are clipped to
// the sample's length; a range past the end gives zero rows.
struct RowRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t halo_end = 0;  // >= end
};

class SampleSource {
 public:
  virtual ~SampleSource() = default;
  virtual int64_t size() const = 0;
  // The index-th sample (0 <= index < size()).
  virtual absl::StatusOr<TrainingSample> Get(int64_t index) = 0;
  // Only some rows of it (context parallelism: a shard and its halo); a
  // source reads no more of the sample than that.
  virtual absl::StatusOr<TrainingSample> GetRows(int64_t index, const RowRange& rows) = 0;
  // The target the samples were computed from (a store's contract.model,
  // the teachers' Describe).
  virtual const ModelContract& model() const = 0;
  // Token count of the index-th sample, without reading its tensors.
  virtual int64_t Length(int64_t index) const = 0;
  // Whether samples carry the teacher's full-vocab argmax (target_ids).
  virtual bool has_target_ids() const = 0;
  // The index-th sample's token ids and loss mask only (cheap: no hidden
  // states are read or computed).
  virtual absl::Status TokenIds(int64_t index, std::vector<int32_t>* ids,
                                std::vector<uint8_t>* mask) = 0;
  // A hint: these samples (these rows of each) will be read soon. Sources
  // that compute samples start on them now; a store ignores it.
  virtual void Prefetch(const std::vector<int64_t>& indices, const RowRange& rows) {}
  // The most samples the reader holds at once, delivered or requested but
  // not yet committed (e.g. this batch and the next). A source whose
  // producers bound what is outstanding must allow at least this many per
  // producer, or a failover onto one producer could wait forever.
  virtual void ReserveOutstanding(int64_t samples) {}
  // The optimizer step `step` (1-based) that used these samples has
  // completed: they count as trained.
  virtual absl::Status Commit(int64_t step, const std::vector<int64_t>& indices) {
    return absl::OkStatus();
  }
};

class StoreSource final : public SampleSource {
 public:
  static absl::StatusOr<std::unique_ptr<StoreSource>> Open(const std::string& dir);
  int64_t size() const override { return reader_->num_samples(); }
  absl::StatusOr<TrainingSample> Get(int64_t index) override;
  absl::StatusOr<TrainingSample> GetRows(int64_t index, const RowRange& rows) override;
  const ModelContract& model() const override { return model_; }
  int64_t Length(int64_t index) const override { return lengths_[index]; }
  bool has_target_ids() const override { return has_target_ids_; }
  absl::Status TokenIds(int64_t index, std::vector<int32_t>* ids,
                        std::vector<uint8_t>* mask) override;
  const StoreReader& reader() const { return *reader_; }

 private:
  std::unique_ptr<StoreReader> reader_;
  ModelContract model_;
  std::vector<int64_t> lengths_;
  bool has_target_ids_ = false;
};

// Right-pads whole samples into one batch, truncating each to max_length
// (0: off).
DraftBatch Collate(const std::vector<TrainingSample>& samples, int64_t max_length);

// One CP rank's shard of a batch: own rows [offset, offset + rows) and
// `halo` rows after them (DraftBatch). `samples` were read with GetRows
// covering at least that window (clipped to their lengths); each is
// truncated to max_length (0: off) and zero-padded to the static shape.
DraftBatch CollateShard(const std::vector<TrainingSample>& samples, int64_t max_length,
                        int64_t offset, int64_t rows, int64_t halo);

// The batch on `device` (tensors already there stay; host tensors are
// copied asynchronously through pinned memory: CopyToDevice).
DraftBatch ToDevice(DraftBatch batch, torch::Device device);

}  // namespace specstream::student

#endif  // SPECSTREAM_STUDENT_DATA_SOURCE_H_
