// libFuzzer target for the job spec parser the CLI and the coordinator share
// (common/jobspec/job_spec.h ParseJobSpecYaml: YAML or JSON text -> a
// validated v1::JobSpec).
//
// Oracles: any bytes get a status, never a crash, an abort, a hang or an
// unbounded allocation (the size limit, the UTF-8 check and the expansion
// limit stand before anything grows); every refusal is InvalidArgument; an
// accepted spec validates again unchanged (ValidateJobSpec is idempotent);
// and its JSON form, as the student daemon writes job.json for the trainer
// (field names kept, whitespace added), parses back to the same spec.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/string_view.h"
#include "common/jobspec/job_spec.h"
#include "google/protobuf/util/json_util.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "job_spec_fuzz: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using specstream::jobspec::JobSpecFingerprint;
  using specstream::jobspec::ParseJobSpecYaml;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  absl::StatusOr<specstream::v1::JobSpec> spec = ParseJobSpecYaml(text);
  if (!spec.ok()) {
    if (spec.status().code() != absl::StatusCode::kInvalidArgument) {
      Fail("a refusal that is not InvalidArgument", spec.status().ToString());
    }
    return 0;
  }
  const std::string fingerprint = JobSpecFingerprint(*spec);

  specstream::v1::JobSpec again = *spec;
  if (absl::Status valid = specstream::jobspec::ValidateJobSpec(again); !valid.ok()) {
    Fail("an accepted spec does not validate again", valid.ToString());
  }
  if (JobSpecFingerprint(again) != fingerprint) {
    Fail("validating an accepted spec again changed it", again.ShortDebugString());
  }

  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  print.add_whitespace = true;
  if (!google::protobuf::util::MessageToJsonString(*spec, &json, print).ok()) {
    Fail("an accepted spec does not print as JSON", spec->ShortDebugString());
  }
  absl::StatusOr<specstream::v1::JobSpec> reparsed = ParseJobSpecYaml(json);
  if (!reparsed.ok()) {
    Fail("the JSON of an accepted spec is refused",
         reparsed.status().ToString() + "\n--- JSON:\n" + json);
  }
  if (JobSpecFingerprint(*reparsed) != fingerprint) {
    Fail("the JSON of an accepted spec parses to another spec",
         spec->ShortDebugString() + "\n--- became:\n" + reparsed->ShortDebugString());
  }
  return 0;
}
