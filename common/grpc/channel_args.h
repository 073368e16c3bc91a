// The gRPC channel arguments SpecStream tunes, in one place (measured in
// tests/bench/transport_bench.cc and multihost_bench.cc):
//   * bulk payloads (the teacher stream): large HTTP/2 frames and TCP reads,
//     a write buffer of a few chunks, a large per-stream window;
//   * keepalive between teachers and students, so a dead peer's connection
//     is found within seconds;
//   * daemons to the coordinator: reconnect about as often as they
//     heartbeat.
// Thread-safe (no state).
#ifndef SPECSTREAM_COMMON_GRPC_CHANNEL_ARGS_H_
#define SPECSTREAM_COMMON_GRPC_CHANNEL_ARGS_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/channel_arguments.h"

namespace specstream {

// Per-stream HTTP/2 window of bulk streams. BDP probing stays on in
// production: it is what grows the connection's window with the round trip
// (with it off, a teacher 20 ms away streamed ~5 MB/s and the student waited
// every step: multihost_bench 0.65x the clean link; 1.0x with it on).
inline constexpr int kBulkStreamLookaheadBytes = 64 << 20;

// The control plane's message limit, both ways (the CLI and the daemons to
// the coordinator): a job carries its spec and last metrics, a heartbeat the
// log lines its daemon buffered while the coordinator was away.
inline constexpr int kMaxControlMessageBytes = 64 << 20;

// The server-side arguments of bulk payloads for chunks of `chunk_bytes`:
// large frames and TCP reads, a write buffer of a few chunks (so a stream
// keeps the socket busy while its next chunk is framed), as (name, value).
std::vector<std::pair<const char*, int>> BulkPayloadServerArguments(uint64_t chunk_bytes);

// Server keepalive: ping an idle connection every `time`, drop it when the
// ping is not answered within `timeout`; accept clients' keepalive pings
// down to every 10 s, with or without calls.
std::vector<std::pair<const char*, int>> KeepaliveServerArguments(absl::Duration time,
                                                                  absl::Duration timeout);

// Adds (name, value) arguments to a server builder.
void AddServerArguments(grpc::ServerBuilder& builder,
                        const std::vector<std::pair<const char*, int>>& arguments);

// A student's channel to a teacher: no receive limit (payload chunks are as
// large as the teacher says), keepalive every 20 s (10 s timeout), the bulk
// stream window, and reconnection backoff from 0.1 s up to 5 s.
grpc::ChannelArguments TeacherChannelArguments();

// A daemon's channel to the coordinator: reconnect backoff of 200 ms to 1 s
// (gRPC's default grows to minutes, longer than the coordinator waits for
// daemons to come back after it restarts), and sends up to
// `max_send_bytes`.
grpc::ChannelArguments CoordinatorChannelArguments(int max_send_bytes);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_GRPC_CHANNEL_ARGS_H_
