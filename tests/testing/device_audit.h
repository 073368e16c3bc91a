// Device discipline on a machine with no accelerator: run a path with its
// data on the `meta` device inside a DeviceAudit, and every ATen op that meets
// tensors on two devices is recorded, whether or not the op itself checks
// (on meta, matmul, linear, embedding and index_select accept a CPU operand
// silently). That is what catches a CPU tensor made next to a device input
// (torch::arange(n) without the input's options, a host-side table).
//
// Mechanism: a thread-local RecordFunction callback that sees each op's
// inputs before its kernel runs. 0-dim CPU tensors are scalars, which every
// device accepts, and are ignored; so are the transfers (to, _to_copy,
// copy_), which cross devices on purpose. Ops with data-dependent results (item(),
// nonzero) cannot run on meta; audit those paths in pieces.
#ifndef SPECSTREAM_TESTS_TESTING_DEVICE_AUDIT_H_
#define SPECSTREAM_TESTS_TESTING_DEVICE_AUDIT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace specstream::testing {

class DeviceAudit {
 public:
  // Starts recording on this thread (one audit per thread at a time).
  DeviceAudit();
  ~DeviceAudit();
  DeviceAudit(const DeviceAudit&) = delete;
  DeviceAudit& operator=(const DeviceAudit&) = delete;

  // "aten::add: cpu [4], meta [4, 4]" per offending op call, in order.
  const std::vector<std::string>& mixed() const { return mixed_; }
  // Ops seen (a check that the callback ran at all).
  int64_t ops() const { return ops_; }

  // Called by the callback.
  void Record(std::string line) { mixed_.push_back(std::move(line)); }
  void Count() { ++ops_; }

 private:
  uint64_t handle_ = 0;
  std::vector<std::string> mixed_;
  int64_t ops_ = 0;
};

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_DEVICE_AUDIT_H_
