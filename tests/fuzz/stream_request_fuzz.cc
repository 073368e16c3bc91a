// libFuzzer target for the TeacherService request decoder: the bytes of one
// StreamRequest message, parsed as the teacher's stream reactor parses them
// (services/teacher), then put through the checks its stream session applies
// to each kind (teacher/stream_request.h AcceptOpen and ValidateCredit,
// teacher/sample_request.h ValidateSampleRequest and RequestRows).
//
// The session's state machine (Open first and once, unique request ids,
// credits) needs the compute batcher and so LibTorch; stream_session_test
// covers it. This target covers what each message alone can do to a teacher.
//
// An shm Open attaches a ring the fuzzer created (the name in the input is
// replaced: the fuzzer never opens a segment named by its input, which could
// be another process's), with the input's capacity and chunk size; NCCL
// Opens meet a join that is never called (OpenPayloadSender only checks the
// id). Oracles:
//   * any bytes either fail to parse or parse to a message that serialises
//     to bytes which parse back to the same bytes;
//   * no check crashes; every refusal is the status its header names, and
//     names the field it refuses;
//   * an accepted Open's sender has the transport asked for and a chunk size
//     in [1, configured], within max_chunk_bytes and, for shm, the ring, and
//     its capture_layer_ids are ascending, distinct and within the model;
//   * an accepted SampleRequest has ids within the vocab, a 0/1 mask of one
//     byte per token or none, and rows [begin, end) that are non-empty,
//     inside the sample and around the slice asked for.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/transport/payload_sender.h"
#include "common/transport/shm_ring.h"
#include "google/protobuf/stubs/logging.h"
#include "specstream/v1/teacher.pb.h"
#include "teacher/sample_request.h"
#include "teacher/stream_request.h"

namespace {

using specstream::v1::StreamRequest;

// What the teacher serves (a Qwen-sized vocabulary, 2048-token samples).
constexpr int64_t kMaxTokens = 2048;
constexpr int64_t kVocabSize = 151936;
constexpr specstream::v1::DType kPayloadDtype = specstream::v1::DTYPE_BF16;
constexpr int64_t kNumLayers = 64;
// The fuzzer's ring: seeds ask for this capacity.
constexpr uint64_t kRingCapacity = 64 << 10;

[[noreturn]] void Fail(const char* what, const StreamRequest& request, const std::string& detail) {
  std::fprintf(stderr, "stream_request_fuzz: %s: %s\nrequest: %s\n", what, detail.c_str(),
               request.ShortDebugString().c_str());
  std::abort();
}

struct Teacher {
  std::unique_ptr<specstream::ShmRing> ring;  // its owner: unlinked at exit
  specstream::PayloadSenderConfig sender;
};

Teacher MakeTeacher() {
  Teacher t;
  specstream::ShmRingOptions ring;
  ring.name = absl::StrCat("/specstream-fuzz-", ::getpid());
  ring.capacity = kRingCapacity;
  ring.populate = false;
  auto created = specstream::ShmRing::Create(ring);
  if (!created.ok()) {
    std::fprintf(stderr, "stream_request_fuzz: cannot create the shm ring: %s\n",
                 created.status().ToString().c_str());
    std::abort();
  }
  t.ring = *std::move(created);
  t.sender.built_with_nccl = true;
  t.sender.nccl_join = [](absl::string_view, specstream::PayloadChannelOptions)
      -> absl::StatusOr<std::unique_ptr<specstream::PayloadChannel>> {
    std::fprintf(stderr, "stream_request_fuzz: an Open joined NCCL\n");
    std::abort();
  };
  return t;
}

const Teacher& GetTeacher() {
  static const Teacher teacher = MakeTeacher();
  return teacher;
}

void CheckRefusal(const absl::Status& status, const char* field, const StreamRequest& request) {
  if (!absl::StrContains(status.message(), field)) {
    Fail("a refusal that does not name its field", request, status.ToString());
  }
}

void CheckOpen(const StreamRequest& request) {
  const Teacher& teacher = GetTeacher();
  StreamRequest::Open open = request.open();
  if (!open.shm_name().empty()) open.set_shm_name(teacher.ring->name());
  auto sender = specstream::teacher::AcceptOpen(open, teacher.sender, kPayloadDtype, kNumLayers);
  if (!sender.ok()) {
    const absl::StatusCode code = sender.status().code();
    if (code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kFailedPrecondition) {
      Fail("an Open refused with an unexpected code", request, sender.status().ToString());
    }
    CheckRefusal(sender.status(), "open.", request);
    if (absl::StrContains(sender.status().message(), "open.capture_layer_ids") &&
        code != absl::StatusCode::kInvalidArgument) {
      Fail("capture_layer_ids refused with a code other than INVALID_ARGUMENT", request,
           sender.status().ToString());
    }
    return;
  }
  const auto& ids = open.capture_layer_ids();
  for (int i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= kNumLayers || (i > 0 && ids[i] <= ids[i - 1])) {
      Fail("capture_layer_ids that are not ascending, distinct and within the model were accepted",
           request, "");
    }
  }
  const specstream::PayloadSender& s = **sender;
  if (s.transport() != open.transport()) {
    Fail("the sender's transport is not the one asked for", request, "");
  }
  const uint64_t chunk = s.chunk_bytes();
  if (chunk == 0 || chunk > teacher.sender.chunk_bytes ||
      (open.max_chunk_bytes() > 0 && chunk > open.max_chunk_bytes())) {
    Fail("chunk size out of range", request, absl::StrCat(chunk));
  }
  if (open.transport() == specstream::v1::TRANSPORT_SHM &&
      (open.shm_capacity() != kRingCapacity || chunk > kRingCapacity)) {
    Fail("an shm sender that does not fit the ring", request, absl::StrCat(chunk));
  }
  if (open.contract_dtype() != specstream::v1::DTYPE_UNSPECIFIED &&
      open.contract_dtype() != kPayloadDtype) {
    Fail("a contract dtype the teacher does not send was accepted", request, "");
  }
}

void CheckSample(const StreamRequest& request) {
  const StreamRequest::SampleRequest& r = request.sample();
  const absl::Status valid = specstream::teacher::ValidateSampleRequest(r, kMaxTokens, kVocabSize);
  if (!valid.ok()) {
    if (valid.code() != absl::StatusCode::kInvalidArgument) {
      Fail("a sample refused with an unexpected code", request, valid.ToString());
    }
    CheckRefusal(valid, "sample.", request);
    return;
  }
  const int64_t t = r.token_ids_size();
  if (r.request_id() == 0 || t == 0 || t > kMaxTokens) Fail("bad sample accepted", request, "");
  for (int32_t id : r.token_ids()) {
    if (id < 0 || id >= kVocabSize) Fail("a token id outside the vocab accepted", request, "");
  }
  if (!r.loss_mask().empty() && static_cast<int64_t>(r.loss_mask().size()) != t) {
    Fail("a loss mask of the wrong length accepted", request, "");
  }
  for (char b : r.loss_mask()) {
    if (b != 0 && b != 1) Fail("a loss mask byte other than 0/1 accepted", request, "");
  }
  const auto [begin, end] = specstream::teacher::RequestRows(r);
  if (begin < 0 || begin >= end || end > t) {
    Fail("rows outside the sample", request, absl::StrCat("[", begin, ", ", end, ")"));
  }
  if (r.slice_end() != 0 && (begin > r.slice_begin() || end < r.slice_end())) {
    Fail("rows that do not cover the slice", request, absl::StrCat("[", begin, ", ", end, ")"));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // Protobuf logs each string field that is not UTF-8 (the parse is refused:
  // the session's malformed-request path); millions of lines would only
  // fill the log.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  StreamRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;

  // Re-serialised, it parses back to the same bytes (unknown fields kept).
  const std::string bytes = request.SerializeAsString();
  if (bytes.size() != request.ByteSizeLong()) Fail("ByteSizeLong disagrees", request, "");
  StreamRequest again;
  if (!again.ParseFromString(bytes)) Fail("re-serialised bytes do not parse", request, "");
  if (again.SerializeAsString() != bytes) Fail("the round trip changed the bytes", request, "");

  switch (request.kind_case()) {
    case StreamRequest::kOpen:
      CheckOpen(request);
      break;
    case StreamRequest::kSample:
      CheckSample(request);
      break;
    case StreamRequest::kCredit: {
      const absl::Status valid = specstream::teacher::ValidateCredit(request.credit());
      if (valid.ok() != (request.credit().n() > 0)) {
        Fail("credit check disagrees with n > 0", request, valid.ToString());
      }
      if (!valid.ok()) CheckRefusal(valid, "credit.", request);
      break;
    }
    case StreamRequest::kAck:  // unknown ids are ignored: nothing to check
    case StreamRequest::KIND_NOT_SET:
      break;
  }
  return 0;
}
