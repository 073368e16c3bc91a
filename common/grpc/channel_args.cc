#include "common/grpc/channel_args.h"

#include <algorithm>

#include "grpc/grpc.h"

namespace specstream {

std::vector<std::pair<const char*, int>> BulkPayloadServerArguments(uint64_t chunk_bytes) {
  const uint64_t write_buffer = std::min<uint64_t>(
      uint64_t{64} << 20, std::max<uint64_t>(uint64_t{8} << 20, 4 * chunk_bytes));
  return {
      {GRPC_ARG_HTTP2_MAX_FRAME_SIZE, (16 << 20) - 1},
      {GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, static_cast<int>(write_buffer)},
      {GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 4 << 20},
      {GRPC_ARG_TCP_READ_CHUNK_SIZE, 4 << 20},
      {GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, 1 << 20},
      {GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, 16 << 20},
  };
}

std::vector<std::pair<const char*, int>> KeepaliveServerArguments(absl::Duration time,
                                                                  absl::Duration timeout) {
  return {
      {GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(absl::ToInt64Milliseconds(time))},
      {GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(absl::ToInt64Milliseconds(timeout))},
      {GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1},
      {GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000},
      {GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0},
  };
}

void AddServerArguments(grpc::ServerBuilder& builder,
                        const std::vector<std::pair<const char*, int>>& arguments) {
  for (const auto& [name, value] : arguments) builder.AddChannelArgument(name, value);
}

grpc::ChannelArguments TeacherChannelArguments() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kBulkStreamLookaheadBytes);
  // A restarted teacher (data.teacher_grace_s) is reached again within
  // about the online source's own backoff, not gRPC's default (1 s growing
  // to 120 s).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  return args;
}

grpc::ChannelArguments CoordinatorChannelArguments(int max_send_bytes) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetMaxSendMessageSize(max_send_bytes);
  return args;
}

}  // namespace specstream
