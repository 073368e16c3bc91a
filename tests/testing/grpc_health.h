// The standard gRPC health check as an outside client (a Kubernetes probe)
// makes it, without generated health stubs.
#ifndef SPECSTREAM_TESTS_TESTING_GRPC_HEALTH_H_
#define SPECSTREAM_TESTS_TESTING_GRPC_HEALTH_H_

#include <string>

#include "absl/time/time.h"

namespace specstream::testing {

// grpc.health.v1.Health/Check for the empty service name against `target`
// (host:port, plaintext): "SERVING", "NOT_SERVING", "unknown", or
// "error: <message>" (a deadline past `timeout` included).
std::string HealthCheck(const std::string& target, absl::Duration timeout = absl::Seconds(5));

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_GRPC_HEALTH_H_
