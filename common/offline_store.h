// The offline store: teacher features dumped to disk once and read by any
// number of student runs (DESIGN §7). `specstream-teacher dump` writes it with
// StoreWriter; students read it with StoreReader.
//
// Layout of a store directory:
//   index.json                 the contract and the shard list (below)
//   shard-00000.safetensors    plain safetensors files, 5-digit numbering
//   shard-00001.safetensors    ...
// Sample `s` (a non-negative int64 id, the record index in the input data,
// written in decimal) is the tensors "<s>.<name>" of one shard, for every
// `name` of the contract's tensor list, e.g. "17.input_ids", "17.aux_hidden".
// Every tensor of a sample has the sample's token count T as its first
// dimension; the remaining dimensions and the dtype are fixed by the contract.
//
// index.json (two-space indent, keys sorted, rewritten atomically after every
// finished shard):
//   {"format": "specstream-offline-store", "version": 1,
//    "contract": {... free-form object chosen by the writer; its "tensors"
//                 entry is required and read by this code, see below ...},
//    "shards": [{"file": "shard-00000.safetensors", "samples": [ids...],
//                "tokens": N, "bytes": B}, ...],
//    "complete": true|false}
// `samples` lists a shard's ids in the order they were added, `tokens` is the
// sum of their T, `bytes` the shard file's size. `complete` becomes true when
// the writer's Finish() ran.
//
// contract["tensors"] maps each tensor name to {"dtype": "<safetensors dtype>",
// "shape": ["T", d1, d2, ...]}: the leading "T" stands for the sample's token
// count, the other dimensions are positive integers. Names are [A-Za-z0-9_]+.
// Example: {"input_ids": {"dtype": "I32", "shape": ["T"]},
//           "aux_hidden": {"dtype": "BF16", "shape": ["T", 12288]}}.
// StoreTensorsContract() builds it from StoreTensorSpecs.
//
// Determinism: shards are cut by a rule that depends only on the sequence of
// added samples (after each Add, the shard is written once its tensor bytes
// reach max_shard_bytes or its sample count reaches max_shard_samples), the
// safetensors layout is canonical, and a resumed writer starts at a shard
// boundary. So a dump that is killed, reopened with the same contract and
// options, skips the ids Contains() reports and adds the rest in the same
// order produces a store byte-identical to an uninterrupted dump.
#ifndef SPECSTREAM_COMMON_OFFLINE_STORE_H_
#define SPECSTREAM_COMMON_OFFLINE_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/safetensors.h"
#include "nlohmann/json.hpp"

namespace specstream {

inline constexpr absl::string_view kOfflineStoreFormat = "specstream-offline-store";
inline constexpr int kOfflineStoreVersion = 1;
inline constexpr absl::string_view kOfflineStoreIndexFile = "index.json";

// "shard-00042.safetensors" for 42 (at least 5 digits).
std::string OfflineStoreShardFileName(int64_t shard);

// One tensor every sample carries: dtype and the dimensions after T.
struct StoreTensorSpec {
  std::string name;  // Without the "<id>." prefix, e.g. "aux_hidden".
  DType dtype = DType::kF32;
  std::vector<int64_t> inner_shape;  // Empty for [T] tensors.
};

// The value of contract["tensors"] for `specs`.
nlohmann::json StoreTensorsContract(const std::vector<StoreTensorSpec>& specs);

// Parses and validates contract["tensors"]; the result is sorted by name.
// InvalidArgument naming the field (e.g. `contract.tensors.aux_hidden.shape`).
absl::StatusOr<std::vector<StoreTensorSpec>> ParseStoreTensorSpecs(const nlohmann::json& contract);

struct StoreWriterOptions {
  // A shard is written once the tensor bytes buffered in it reach this many
  // bytes (checked after each sample, so a shard may exceed it by one sample).
  int64_t max_shard_bytes = int64_t{512} << 20;
  // ... or once it holds this many samples; 0 means no limit.
  int64_t max_shard_samples = 0;
};

// Writes a store. One thread at a time (not thread-safe). Tensors passed to
// Add() are copied; the writer holds at most one shard in memory.
class StoreWriter final {
 public:
  // Creates `dir` if needed. When `dir`/index.json exists the writer resumes:
  // the index must be valid, its contract must equal `contract`
  // (FailedPrecondition naming the first differing key otherwise), its shards
  // must exist with the recorded sizes (DataLoss otherwise); shard files and
  // temporaries the index does not list (left by a killed writer) are
  // deleted, and numbering continues after the listed shards. Otherwise a
  // fresh index (no shards, complete false) is written at once.
  // InvalidArgument on bad options or a contract without a valid "tensors".
  static absl::StatusOr<std::unique_ptr<StoreWriter>> Open(const std::string& dir,
                                                           nlohmann::json contract,
                                                           StoreWriterOptions options = {});

  StoreWriter(const StoreWriter&) = delete;
  StoreWriter& operator=(const StoreWriter&) = delete;

  // True for ids in a finished shard or buffered in the current one.
  bool Contains(int64_t id) const;

  // Buffers sample `id` (tensor names without the "<id>." prefix, any order)
  // and writes the shard, then index.json, when it is full. Nothing is
  // buffered on error. InvalidArgument (naming the id and the tensor) for a
  // negative id, a tensor missing, unknown or given twice, a dtype or inner
  // shape differing from the contract, first dimensions that disagree, T = 0,
  // or a byte count that does not match the shape; AlreadyExists for an id
  // already stored or buffered; FailedPrecondition after Finish() or after a
  // failed write (the writer is then unusable; reopen to resume).
  absl::Status Add(int64_t id, const std::vector<TensorView>& tensors);

  // Writes the last partial shard (if any) and index.json with complete true.
  // A second call is a no-op.
  absl::Status Finish();

  const std::string& dir() const { return dir_; }
  // Samples in finished shards (resumed or written by this writer).
  int64_t num_stored_samples() const { return static_cast<int64_t>(stored_.size()); }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }

 private:
  struct Shard {
    std::string file;
    std::vector<int64_t> samples;
    int64_t tokens = 0;
    int64_t bytes = 0;
  };

  StoreWriter() = default;
  // Serializes and writes the buffered shard, then the index.
  absl::Status FlushShard();
  absl::Status WriteIndex(bool complete);

  std::string dir_;
  nlohmann::json contract_;
  StoreWriterOptions options_;
  std::vector<StoreTensorSpec> specs_;
  std::vector<Shard> shards_;                           // Finished, in order.
  absl::flat_hash_map<int64_t, size_t> stored_;         // id -> shards_ index
  std::unique_ptr<SafetensorsWriter> pending_;          // Null when nothing is buffered.
  std::vector<int64_t> pending_samples_;                // In Add order.
  absl::flat_hash_map<int64_t, size_t> pending_index_;  // id -> pending_samples_ position
  int64_t pending_tokens_ = 0;
  int64_t pending_bytes_ = 0;  // Tensor data bytes.
  bool finished_ = false;
  absl::Status broken_;  // Set after a failed write.
};

// Reads a store. Thread-safe: Get() may be called from any thread; shards
// are mapped on first use and stay mapped until the reader is destroyed, so
// the views Get() returns are valid as long as the reader lives.
class StoreReader final {
 public:
  // Parses and validates index.json and checks that every listed shard file
  // exists with the recorded size. NotFound when index.json is missing;
  // DataLoss naming the file and the field for a malformed index (a bad
  // contract "tensors" entry included) or a missing or resized shard.
  static absl::StatusOr<std::unique_ptr<StoreReader>> Open(const std::string& dir);

  StoreReader(const StoreReader&) = delete;
  StoreReader& operator=(const StoreReader&) = delete;

  const std::string& dir() const { return dir_; }
  const nlohmann::json& contract() const { return contract_; }
  const std::vector<StoreTensorSpec>& tensor_specs() const { return specs_; }
  bool complete() const { return complete_; }
  // All ids in store order (shard by shard, in Add order within a shard).
  const std::vector<int64_t>& sample_ids() const { return sample_ids_; }
  int64_t num_samples() const { return static_cast<int64_t>(sample_ids_.size()); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  bool Contains(int64_t id) const { return shard_of_.contains(id); }

  // The sample's tensors, in tensor_specs() order, named without the "<id>."
  // prefix; views into the mapped shard. NotFound naming the id when absent.
  // On the first use of a shard, verifies that it holds exactly the listed
  // samples' tensors with the contract's dtypes and shapes and the recorded
  // token count (DataLoss otherwise; the error is kept for later calls).
  absl::StatusOr<std::vector<TensorView>> Get(int64_t id) const;

 private:
  struct Shard {
    std::string file;
    std::vector<int64_t> samples;
    int64_t tokens = 0;
    int64_t bytes = 0;
  };
  struct OpenedShard {
    std::unique_ptr<SafetensorsFile> file;  // Null until opened or on error.
    absl::Status status;                    // Error of the first open.
    bool tried = false;
  };

  StoreReader() = default;
  // Maps and verifies shard `index` once; returns the file or the kept error.
  absl::StatusOr<const SafetensorsFile*> OpenShard(size_t index) const;

  std::string dir_;
  nlohmann::json contract_;
  std::vector<StoreTensorSpec> specs_;
  bool complete_ = false;
  std::vector<Shard> shards_;
  std::vector<int64_t> sample_ids_;
  absl::flat_hash_map<int64_t, size_t> shard_of_;  // id -> shards_ index
  int64_t num_tokens_ = 0;

  mutable absl::Mutex mu_;
  mutable std::vector<OpenedShard> opened_ ABSL_GUARDED_BY(mu_);
};

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_OFFLINE_STORE_H_
