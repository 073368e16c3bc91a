#include "teacher/sample_request.h"

#include <cstddef>
#include <string>

#include "absl/strings/str_format.h"

namespace specstream::teacher {

absl::Status ValidateSampleRequest(const v1::StreamRequest::SampleRequest& r, int64_t max_tokens,
                                   int64_t vocab_size) {
  if (r.request_id() == 0) return absl::InvalidArgumentError("sample.request_id: must be > 0");
  const int64_t t = r.token_ids_size();
  if (t == 0) return absl::InvalidArgumentError("sample.token_ids: empty");
  if (t > max_tokens) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sample.token_ids: %d tokens, over max_tokens %d", t, max_tokens));
  }
  for (int64_t i = 0; i < t; ++i) {
    const int32_t id = r.token_ids(static_cast<int>(i));
    if (id < 0 || id >= vocab_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sample.token_ids[%d]: id %d is outside the vocab [0, %d)", i, id, vocab_size));
    }
  }
  const std::string& mask = r.loss_mask();
  if (!mask.empty() && static_cast<int64_t>(mask.size()) != t) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sample.loss_mask: %d bytes for %d tokens (one byte per token, or none)", mask.size(), t));
  }
  for (size_t i = 0; i < mask.size(); ++i) {
    const auto b = static_cast<uint8_t>(mask[i]);
    if (b > 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sample.loss_mask[%d]: %d is not 0 or 1", i, b));
    }
  }
  if (r.slice_end() == 0) {
    if (r.slice_begin() != 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "sample.slice_begin: %d with slice_end 0 (the whole sample needs slice_begin 0)",
          r.slice_begin()));
    }
    if (r.halo_before() != 0 || r.halo_after() != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("sample.%s: %d with slice_end 0 (the whole sample has no halos)",
                          r.halo_before() != 0 ? "halo_before" : "halo_after",
                          r.halo_before() != 0 ? r.halo_before() : r.halo_after()));
    }
    return absl::OkStatus();
  }
  if (r.slice_begin() < 0 || r.slice_begin() >= r.slice_end() || r.slice_end() > t) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sample.slice_begin/slice_end: [%d, %d) is not a non-empty range "
                        "within the %d tokens",
                        r.slice_begin(), r.slice_end(), t));
  }
  if (r.halo_before() < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("sample.halo_before: %d < 0", r.halo_before()));
  }
  if (r.halo_after() < 0) {
    return absl::InvalidArgumentError(absl::StrFormat("sample.halo_after: %d < 0", r.halo_after()));
  }
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> RequestRows(const v1::StreamRequest::SampleRequest& r) {
  const int64_t t = r.token_ids_size();
  if (r.slice_end() == 0) return {0, t};
  // Saturating: halos may be as large as the student likes.
  const int64_t begin = r.halo_before() >= r.slice_begin() ? 0 : r.slice_begin() - r.halo_before();
  const int64_t end = r.halo_after() >= t - r.slice_end() ? t : r.slice_end() + r.halo_after();
  return {begin, end};
}

}  // namespace specstream::teacher
