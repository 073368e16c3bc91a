#include "common/status.h"

#include <utility>

#include "common/exit_code.h"
#include "common/grpc/status.h"
#include "gtest/gtest.h"

namespace specstream {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  ASSIGN_OR_RETURN(int half, Half(x));
  ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusTest, MacrosPropagateErrorsAndValues) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(3).message(), "odd");
}

TEST(StatusTest, AnnotateKeepsCodeAndPrefixesMessage) {
  absl::Status s = Annotate(absl::NotFoundError("no such tensor"), "model.safetensors");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "model.safetensors: no such tensor");
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ctx").ok());
}

TEST(GrpcStatusTest, EveryCodeRoundTrips) {
  for (int code = 0; code <= 16; ++code) {
    absl::Status s(static_cast<absl::StatusCode>(code), code == 0 ? "" : "why");
    grpc::Status g = ToGrpcStatus(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    absl::Status back = FromGrpcStatus(g);
    EXPECT_EQ(back, s) << code;
  }
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("down")).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(ToGrpcStatus(absl::UnavailableError("down")).error_message(), "down");
}

// The exit-code contract every binary shares (README, docs/operations.md).
TEST(ExitCodeForTest, EveryStatusCodeHasTheDocumentedExitCode) {
  using C = absl::StatusCode;
  const std::pair<C, int> expected[] = {
      {C::kOk, 0},
      {C::kCancelled, 1},
      {C::kUnknown, 1},
      {C::kInvalidArgument, 2},
      {C::kDeadlineExceeded, 124},
      {C::kNotFound, 4},
      {C::kAlreadyExists, 2},
      {C::kPermissionDenied, 3},
      {C::kResourceExhausted, 1},
      {C::kFailedPrecondition, 2},
      {C::kAborted, 1},
      {C::kOutOfRange, 2},
      {C::kUnimplemented, 1},
      {C::kInternal, 1},
      {C::kUnavailable, 3},
      {C::kDataLoss, 1},
      {C::kUnauthenticated, 3},
  };
  for (const auto& [code, exit_code] : expected) {
    EXPECT_EQ(ExitCodeFor(absl::Status(code, code == C::kOk ? "" : "x")), exit_code)
        << absl::StatusCodeToString(code);
  }
}

TEST(ExitCodeForTest, ReportExitNamesTheProgramAndTheReason) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ReportExit("specstream-x", absl::OkStatus()), 0);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ReportExit("specstream-x", absl::NotFoundError("job j-1: unknown")), 4);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "specstream-x: job j-1: unknown\n");
}

TEST(ExitCodeForTest, ReportExitEscapesControlCharactersButKeepsLines) {
  // The message quotes an id a user typed: it must not reach the terminal raw.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(ReportExit("specstream-x", absl::NotFoundError("job a\x1b[2Jb not found\n\tat x")), 4);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "specstream-x: job a\\x1b[2Jb not found\n\tat x\n");
}

}  // namespace
}  // namespace specstream
