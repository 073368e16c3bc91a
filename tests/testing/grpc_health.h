// The standard gRPC health check as an outside client (a Kubernetes probe)
// makes it, without generated health stubs; and server reflection's
// list_services as grpcurl asks it.
#ifndef SPECSTREAM_TESTS_TESTING_GRPC_HEALTH_H_
#define SPECSTREAM_TESTS_TESTING_GRPC_HEALTH_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace specstream::testing {

// grpc.health.v1.Health/Check for the empty service name against `target`
// (host:port, plaintext): "SERVING", "NOT_SERVING", "unknown", or
// "error: <message>" (a deadline past `timeout` included).
std::string HealthCheck(const std::string& target, absl::Duration timeout = absl::Seconds(5));

// grpc.reflection.v1alpha list_services against `target` (plaintext),
// presenting `token` as a bearer token when it is not empty: the service
// names, or the call's error as a Status of the same code.
absl::StatusOr<std::vector<std::string>> ReflectionServices(const std::string& target,
                                                            const std::string& token);

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_GRPC_HEALTH_H_
