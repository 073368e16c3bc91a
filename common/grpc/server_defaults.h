// What every SpecStream gRPC server shares: the standard health service
// (grpc.health.v1.Health, open to all, for probes), switched on once per
// process before the first ServerBuilder exists, the listening address form,
// and the health status of a started server. Server reflection is each
// server's own ReflectionService (common/grpc/reflection.h), behind its
// token. Thread-safe.
#ifndef SPECSTREAM_COMMON_GRPC_SERVER_DEFAULTS_H_
#define SPECSTREAM_COMMON_GRPC_SERVER_DEFAULTS_H_

#include <initializer_list>
#include <string>

#include "absl/strings/string_view.h"
#include "grpcpp/server.h"

namespace specstream {

// Health for every server built after it; idempotent.
void EnableServerDefaults();

// "host:port" a server listens on or a client dials, IPv6 hosts in brackets
// (an already bracketed host is kept).
std::string ListenAddress(absl::string_view host, int port);

// Sets the health status of "" and each of `services` on a started server
// (no-op when its health service is off).
void SetServing(grpc::Server& server, bool serving,
                std::initializer_list<absl::string_view> services = {});

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_GRPC_SERVER_DEFAULTS_H_
