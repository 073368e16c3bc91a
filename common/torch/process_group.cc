#include "common/torch/process_group.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/net_address.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"

namespace specstream {

namespace {

constexpr char kJoinPrefix[] = "specstream/join/";
constexpr char kJoinErrors[] = "specstream/join/errors";
constexpr char kJoinDone[] = "specstream/join/failed-and-read";

std::string JoinKey(int rank) { return absl::StrCat(kJoinPrefix, rank); }
std::string JoinErrorKey(int rank) { return absl::StrCat(kJoinPrefix, "error/", rank); }

std::string StoreAddress(const RendezvousOptions& o) {
  return absl::StrCat(o.master_addr, ":", o.master_port);
}

std::string Seconds(std::chrono::milliseconds d) {
  return absl::StrCat(static_cast<double>(d.count()) / 1000.0, " s");
}

std::string ToText(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

// The first IPv4 (else IPv6) address of a network interface.
absl::StatusOr<std::string> InterfaceAddress(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::string v4, v6;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || name != i->ifa_name) continue;
    char text[INET6_ADDRSTRLEN] = {};
    if (i->ifa_addr->sa_family == AF_INET && v4.empty()) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof(text));
      v4 = text;
    } else if (i->ifa_addr->sa_family == AF_INET6 && v6.empty()) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, text,
                sizeof(text));
      v6 = text;
    }
  }
  freeifaddrs(list);
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::InvalidArgumentError(absl::StrCat(
      "GLOO_SOCKET_IFNAME: this host has no interface \"", name, "\" with an address"));
}

// Tells the other ranks why this one cannot join (best effort: the store
// may be what failed).
void PublishJoinError(c10d::Store& store, int rank, const std::string& reason) {
  try {
    store.set(JoinErrorKey(rank), std::vector<uint8_t>(reason.begin(), reason.end()));
    store.add(kJoinErrors, 1);
  } catch (const std::exception&) {
  }
}

// Rank 0's process serves the store, so once the rendezvous has failed it
// waits (up to 3 s) until every other rank that joined has read the error
// (each adds one to kJoinDone) before it returns and the store goes away.
void AwaitFailureRead(c10d::Store& store, const RendezvousOptions& o) {
  if (o.rank != 0) return;
  try {
    int64_t others = 0;
    for (int r = 1; r < o.world_size; ++r) others += store.check({JoinKey(r)}) ? 1 : 0;
    const auto linger = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (store.add(kJoinDone, 0) < others && std::chrono::steady_clock::now() < linger) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
  }
}

// Every rank announces "<hostname>, <address>" and waits for all the others
// (or the first published failure) until `deadline`. The first rank to see
// the deadline pass publishes which ranks are missing, so every rank
// reports the same error.
absl::Status JoinBarrier(c10d::Store& store, const RendezvousOptions& o, const std::string& self,
                         std::chrono::steady_clock::time_point deadline) {
  const std::string where = absl::StrCat("rendezvous at ", StoreAddress(o));
  std::vector<std::string> keys;
  for (int r = 0; r < o.world_size; ++r) keys.push_back(JoinKey(r));
  absl::Status status = CatchTorch(where, [&] {
    store.set(JoinKey(o.rank), std::vector<uint8_t>(self.begin(), self.end()));
    while (!store.check(keys)) {
      if (std::chrono::steady_clock::now() >= deadline && store.add(kJoinErrors, 0) == 0) {
        std::vector<std::string> missing, joined;
        for (int r = 0; r < o.world_size; ++r) {
          if (store.check({keys[r]})) {
            joined.push_back(absl::StrCat(r, " (", ToText(store.get(keys[r])), ")"));
          } else {
            missing.push_back(absl::StrCat(r));
          }
        }
        PublishJoinError(
            store, o.rank,
            absl::StrCat("rank", missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
                         " of ", o.world_size, " did not join within ", Seconds(o.join_timeout),
                         " (parallel.rendezvous_timeout_s); joined: rank ",
                         absl::StrJoin(joined, ", rank ")));
      }
      if (store.add(kJoinErrors, 0) > 0) {
        for (int r = 0; r < o.world_size; ++r) {
          if (store.check({JoinErrorKey(r)})) {
            throw std::runtime_error(ToText(store.get(JoinErrorKey(r))));
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  if (status.ok()) return absl::OkStatus();
  if (o.rank == 0) {
    AwaitFailureRead(store, o);
  } else {
    try {
      store.add(kJoinDone, 1);
    } catch (const std::exception&) {
    }
  }
  return absl::DeadlineExceededError(status.message());
}

}  // namespace

absl::StatusOr<std::string> ResolveLocalAddress(const RendezvousOptions& options) {
  if (!options.local_addr.empty()) return options.local_addr;
  if (!options.interface.empty()) return InterfaceAddress(options.interface);
  absl::StatusOr<std::string> toward = LocalAddressToward(options.master_addr);
  if (!toward.ok()) {
    return absl::UnavailableError(absl::StrCat(
        "MASTER_ADDR: ", toward.status().message(),
        " (set this rank's address with --host / SPECSTREAM_HOST or GLOO_SOCKET_IFNAME)"));
  }
  return toward;
}

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> CreateTcpStore(const RendezvousOptions& options,
                                                               int* bound_port) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " must be in [0, ", options.world_size, ")"));
  }
  c10::intrusive_ptr<c10d::TCPStore> store;
  absl::Status status = CatchTorch(
      options.rank == 0
          ? absl::StrCat("rank 0 cannot serve the rendezvous store on port ", options.master_port)
          : absl::StrCat("rank ", options.rank, " on ", LocalHostname(),
                         " cannot reach the rendezvous store at ", StoreAddress(options),
                         " (rank 0's host) within ", Seconds(options.join_timeout)),
      [&] {
        c10d::TCPStoreOptions store_options;
        store_options.port = static_cast<uint16_t>(options.master_port);
        store_options.isServer = options.rank == 0;
        store_options.numWorkers = options.world_size;
        store_options.waitWorkers = false;
        store_options.timeout = options.join_timeout;
        store = c10::make_intrusive<c10d::TCPStore>(options.master_addr, store_options);
      });
  if (!status.ok()) return absl::UnavailableError(status.message());
  store->setTimeout(options.timeout);
  if (bound_port != nullptr) *bound_port = store->getPort();
  return c10::intrusive_ptr<c10d::Store>(store);
}

absl::StatusOr<ProcessGroupHandle> CreateGlooGroup(const RendezvousOptions& options,
                                                   c10::intrusive_ptr<c10d::Store> store) {
  const auto deadline = std::chrono::steady_clock::now() + options.join_timeout;
  ProcessGroupHandle handle;
  if (!store) {
    auto created = CreateTcpStore(options, &handle.port);
    if (!created.ok()) return created.status();
    store = *created;
  }
  handle.store = store;
  const std::string host = LocalHostname();
  absl::StatusOr<std::string> local = ResolveLocalAddress(options);
  std::shared_ptr<::gloo::transport::Device> device;
  absl::Status status =
      local.ok() ? CatchTorch(absl::StrCat("rank ", options.rank, " on ", host,
                                           " cannot bind Gloo to ", *local),
                              [&] {
                                device =
                                    c10d::ProcessGroupGloo::createDeviceForHostname(*local);
                              })
                 : absl::Status(local.status().code(),
                                absl::StrCat("rank ", options.rank, " on ", host, ": ",
                                             local.status().message()));
  if (!status.ok()) {
    PublishJoinError(*store, options.rank, std::string(status.message()));
    AwaitFailureRead(*store, options);
    return absl::UnavailableError(status.message());
  }
  RETURN_IF_ERROR(JoinBarrier(*store, options, absl::StrCat(host, ", ", *local), deadline));
  status = CatchTorch(absl::StrCat("Gloo group rank ", options.rank, " on ", *local), [&] {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create();
    gloo_options->timeout = options.timeout;
    gloo_options->devices.push_back(device);
    handle.group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, options.rank,
                                                               options.world_size, gloo_options);
  });
  if (!status.ok()) return absl::UnavailableError(status.message());
  return handle;
}

absl::Status AllReduceSum(CommGroup& group, torch::Tensor& tensor) {
  return CatchTorch("all_reduce", [&] {
    const bool narrow =
        tensor.scalar_type() == torch::kBFloat16 || tensor.scalar_type() == torch::kFloat16;
    std::vector<torch::Tensor> buffers{narrow ? tensor.to(torch::kFloat32) : tensor.contiguous()};
    group.allreduce(buffers)->wait();
    if (narrow || !tensor.is_contiguous()) {
      tensor.copy_(buffers[0]);
    } else if (buffers[0].data_ptr() != tensor.data_ptr()) {
      tensor.copy_(buffers[0]);
    }
  });
}

absl::Status Broadcast(CommGroup& group, torch::Tensor& tensor, int root) {
  return CatchTorch("broadcast", [&] {
    std::vector<torch::Tensor> buffers{tensor};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    group.broadcast(buffers, options)->wait();
  });
}

absl::StatusOr<torch::Tensor> AllToAllRows(CommGroup& group, const torch::Tensor& input,
                                           const std::vector<int64_t>& send_rows,
                                           const std::vector<int64_t>& recv_rows) {
  torch::Tensor output;
  RETURN_IF_ERROR(CatchTorch("all_to_all", [&] {
    const bool narrow =
        input.scalar_type() == torch::kBFloat16 || input.scalar_type() == torch::kFloat16;
    torch::Tensor send = narrow ? input.to(torch::kFloat32) : input.contiguous();
    int64_t rows = 0;
    for (int64_t r : recv_rows) rows += r;
    std::vector<int64_t> shape = send.sizes().vec();
    shape[0] = rows;
    torch::Tensor receive = torch::empty(shape, send.options());
    std::vector<int64_t> out_splits = recv_rows, in_splits = send_rows;
    group.alltoall_base(receive, send, out_splits, in_splits)->wait();
    output = narrow ? receive.to(input.scalar_type()) : receive;
  }));
  return output;
}

}  // namespace specstream
