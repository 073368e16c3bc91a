// Addresses of this host as other hosts see it. LibTorch-free: the student
// daemon, the trainer's rendezvous and the teacher use it alike.
#ifndef SPECSTREAM_COMMON_NET_ADDRESS_H_
#define SPECSTREAM_COMMON_NET_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace specstream {

struct HostPort {
  std::string host;  // without IPv6 brackets
  int port = 0;
};

// "host:port", "[v6]:port" or "v6-literal" forms of a gRPC target without a
// scheme; InvalidArgument naming `field` when the port is missing or bad.
absl::StatusOr<HostPort> SplitHostPort(absl::string_view address, absl::string_view field);

// A daemon's listening ports: InvalidArgument naming --port unless `port` is
// in [0, 65535] (0: any free one) or --metrics-port unless `metrics_port` is
// in [-1, 65535] (-1: off).
absl::Status CheckListenPorts(int port, int metrics_port);

// A daemon's --port-file and --metrics-port-file: "<port>\n" written
// atomically to `path` once the port is bound (scripts and tests wait for
// it). Nothing when `path` is empty.
absl::Status WritePortFile(const std::string& path, int port);

// Whether a listening host is loopback only: "localhost", 127.0.0.0/8 or
// ::1 (bracketed or not). "0.0.0.0", "::" and any other name are not.
bool IsLoopbackHost(absl::string_view host);

// The local IP address the kernel's routing table picks to reach `remote` (a
// name or an address literal): a UDP socket connected to it sends nothing,
// and its local end is that address. This is the address a peer on
// `remote`'s network reaches this host at, so each rank of a job binds its
// own (torchrun users know it from GLOO_SOCKET_IFNAME). Unavailable, naming
// `remote`, when the name does not resolve or no route leads there.
absl::StatusOr<std::string> LocalAddressToward(const std::string& remote);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_NET_ADDRESS_H_
