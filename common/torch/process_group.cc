#include "common/torch/process_group.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/exit_code.h"
#include "common/host.h"
#include "common/logging.h"
#include "common/net_address.h"
#include "common/status.h"
#include "common/torch/tensor_util.h"

namespace specstream {

namespace {

constexpr char kJoinPrefix[] = "specstream/join/";
constexpr char kJoinErrors[] = "specstream/join/errors";
constexpr char kJoinDone[] = "specstream/join/failed-and-read";

constexpr char kGlooPrefix[] = "specstream/gloo/";
constexpr int kGlooConnectAttempts = 3;

std::string JoinKey(int rank) { return absl::StrCat(kJoinPrefix, rank); }
std::string JoinErrorKey(int rank) { return absl::StrCat(kJoinPrefix, "error/", rank); }

std::string StoreAddress(const RendezvousOptions& o) {
  return absl::StrCat(o.master_addr, ":", o.master_port);
}

std::string Seconds(std::chrono::milliseconds d) {
  return absl::StrCat(static_cast<double>(d.count()) / 1000.0, " s");
}

std::string ToText(const std::vector<uint8_t>& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

struct InterfaceAddressEntry {
  std::string interface, address;
  bool v4 = false;
};

// This host's interfaces and their IP addresses, as getifaddrs lists them.
absl::StatusOr<std::vector<InterfaceAddressEntry>> HostAddresses() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    return absl::UnavailableError(absl::StrCat("getifaddrs: ", std::strerror(errno)));
  }
  std::vector<InterfaceAddressEntry> out;
  for (ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    const int family = i->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw =
        family == AF_INET
            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr)
            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr);
    if (inet_ntop(family, raw, text, sizeof(text)) == nullptr) continue;
    out.push_back({i->ifa_name, text, family == AF_INET});
  }
  freeifaddrs(list);
  return out;
}

// The first IPv4 (else IPv6) address of a network interface.
absl::StatusOr<std::string> InterfaceAddress(const std::string& name) {
  ASSIGN_OR_RETURN(std::vector<InterfaceAddressEntry> entries, HostAddresses());
  std::string v4, v6;
  for (const InterfaceAddressEntry& e : entries) {
    if (e.interface != name) continue;
    if (e.v4 && v4.empty()) v4 = e.address;
    if (!e.v4 && v6.empty()) v6 = e.address;
  }
  if (!v4.empty()) return v4;
  if (!v6.empty()) return v6;
  return absl::InvalidArgumentError(absl::StrCat(
      "GLOO_SOCKET_IFNAME: this host has no interface \"", name, "\" with an address"));
}

// LibTorch 1.13's TCPStore client runs a watch thread that throws
// std::system_error when the store's connection is reset (rank 0's process,
// which serves the store, killed with bytes unread). Thrown on that thread,
// it ends the process through std::terminate with only "Connection reset by
// peer", racing the main thread's own named error. The handler below names
// the store instead and exits with UNAVAILABLE's code; any other uncaught
// exception goes on to the handler it replaced.
struct StoreWatchGuard {
  std::mutex mu;
  std::string where;  // "rendezvous at <address>" of the latest client store
  std::terminate_handler previous = nullptr;
};

StoreWatchGuard& Guard() {
  static StoreWatchGuard* guard = new StoreWatchGuard;
  return *guard;
}

[[noreturn]] void OnTerminate() {
  StoreWatchGuard& guard = Guard();
  if (std::exception_ptr thrown = std::current_exception()) {
    try {
      std::rethrow_exception(thrown);
    } catch (const std::system_error& error) {
      std::string where;
      {
        std::lock_guard<std::mutex> lock(guard.mu);
        where = guard.where;
      }
      if (!where.empty()) {
        Logger()->error(
            "{}: lost the connection to the store ({}); rank 0's process, which serves it, "
            "has gone",
            where, error.what());
        Logger()->flush();
        std::_Exit(ExitCodeFor(absl::UnavailableError(where)));
      }
    } catch (...) {
    }
  }
  if (guard.previous != nullptr) guard.previous();
  std::abort();
}

void GuardStoreWatchThread(const RendezvousOptions& options) {
  StoreWatchGuard& guard = Guard();
  std::lock_guard<std::mutex> lock(guard.mu);
  guard.where = absl::StrCat("rendezvous at ", StoreAddress(options));
  if (std::get_terminate() != &OnTerminate) guard.previous = std::set_terminate(&OnTerminate);
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
// Rank 0 lingers (up to 3 s) until `others` ranks have added one to
// `counter`, i.e. read a failure it is about to return.
void LingerUntilRead(c10d::Store& store, const RendezvousOptions& o, const std::string& counter,
                     const std::function<int64_t()>& others) {
  if (o.rank != 0) return;
  try {
    const int64_t expected = others();
    const auto linger = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (store.add(counter, 0) < expected && std::chrono::steady_clock::now() < linger) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const std::exception&) {
  }
}

void AwaitFailureRead(c10d::Store& store, const RendezvousOptions& o) {
  LingerUntilRead(store, o, kJoinDone, [&] {
    int64_t others = 0;
    for (int r = 1; r < o.world_size; ++r) others += store.check({JoinKey(r)}) ? 1 : 0;
    return others;
  });
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

// Publishes this rank's outcome of a collective step under `prefix` and
// reads every rank's: "" when all succeeded, else the first failure (with
// its rank). An error only when the others' outcomes do not arrive within
// twice the group's timeout (a peer may still be inside a connect that
// began with this rank's and may take the whole timeout). The outcome is the key's name
// (".../ok/<rank>" or
// ".../failed/<rank>"), polled with check: LibTorch 1.13's TCPStore takes
// ~0.2 s for a get, and only a failure's message is read.
absl::StatusOr<std::string> AgreeOnOutcome(c10d::Store& store, const RendezvousOptions& o,
                                           const std::string& prefix, const absl::Status& mine) {
  auto key = [&](bool ok, int rank) { return absl::StrCat(prefix, ok ? "ok/" : "failed/", rank); };
  std::string failure;
  const auto deadline = std::chrono::steady_clock::now() + 2 * o.timeout;
  absl::Status reached = CatchTorch(
      absl::StrCat("rank ", o.rank, " cannot read the other ranks' Gloo connect outcomes"), [&] {
        const std::string text(mine.message());
        store.set(key(mine.ok(), o.rank), std::vector<uint8_t>(text.begin(), text.end()));
        for (int r = 0; r < o.world_size; ++r) {
          while (!store.check({key(true, r)})) {
            if (store.check({key(false, r)})) {
              if (failure.empty()) {
                failure = absl::StrCat("rank ", r, ": ", ToText(store.get(key(false, r))));
              }
              break;
            }
            if (std::chrono::steady_clock::now() >= deadline) {
              throw std::runtime_error(
                  absl::StrCat("rank ", r, " did not report within ", Seconds(2 * o.timeout)));
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
          }
        }
      });
  if (!reached.ok()) return absl::UnavailableError(reached.message());
  return failure;
}

}  // namespace

std::string InterfaceOf(const std::string& address) {
  absl::StatusOr<std::vector<InterfaceAddressEntry>> entries = HostAddresses();
  if (!entries.ok()) return "";
  for (const InterfaceAddressEntry& e : *entries) {
    if (e.address == address) return e.interface;
  }
  return "";
}

absl::Status JoinRendezvous(c10d::Store& store, const RendezvousOptions& options,
                            const std::string& local_address) {
  const auto deadline = std::chrono::steady_clock::now() + options.join_timeout;
  return JoinBarrier(store, options, absl::StrCat(LocalHostname(), ", ", local_address), deadline);
}

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
  if (options.rank != 0) GuardStoreWatchThread(options);
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
      local.ok()
          ? CatchTorch(
                absl::StrCat("rank ", options.rank, " on ", host, " cannot bind Gloo to ", *local),
                [&] { device = c10d::ProcessGroupGloo::createDeviceForHostname(*local); })
          : absl::Status(local.status().code(), absl::StrCat("rank ", options.rank, " on ", host,
                                                             ": ", local.status().message()));
  if (!status.ok()) {
    PublishJoinError(*store, options.rank, std::string(status.message()));
    AwaitFailureRead(*store, options);
    return absl::UnavailableError(status.message());
  }
  RETURN_IF_ERROR(JoinBarrier(*store, options, absl::StrCat(host, ", ", *local), deadline));
  // Gloo's full-mesh connect on LibTorch 2.x now and then sees a peer close a
  // connection while the mesh forms (seen on loopback under a loaded CI
  // host). Every rank retries together: each attempt connects under its own
  // key prefix, and each rank publishes its outcome and reads all the others'
  // before it decides, so no rank ever retries (or gives up) alone.
  for (int attempt = 1;; ++attempt) {
    const std::string prefix = absl::StrCat(kGlooPrefix, attempt, "/");
    status = CatchTorch(absl::StrCat("Gloo group rank ", options.rank, " on ", *local), [&] {
      auto gloo_options = c10d::ProcessGroupGloo::Options::create();
      gloo_options->timeout = options.timeout;
      gloo_options->devices.push_back(device);
      handle.group = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>(prefix + "mesh", store), options.rank,
          options.world_size, gloo_options);
    });
    ASSIGN_OR_RETURN(std::string failure, AgreeOnOutcome(*store, options, prefix, status));
    if (failure.empty()) return handle;
    handle.group.reset();
    if (attempt == kGlooConnectAttempts) {
      // Rank 0's process may serve the store: it stays until the others
      // have read the outcomes.
      const std::string read = prefix + "failure-read";
      if (options.rank == 0) {
        LingerUntilRead(*store, options, read, [&] { return options.world_size - 1; });
      } else {
        CatchTorch("", [&] { store->add(read, 1); }).IgnoreError();
      }
      return absl::UnavailableError(failure);
    }
    Logger()->warn("Gloo connect attempt {} of {} failed ({}); every rank retries", attempt,
                   kGlooConnectAttempts, failure);
  }
}

#if !SPECSTREAM_WITH_TORCH_NCCL
absl::StatusOr<c10::intrusive_ptr<CommGroup>> CreateNcclGroup(const RendezvousOptions&,
                                                              c10::intrusive_ptr<c10d::Store>,
                                                              torch::Device device) {
  return absl::FailedPreconditionError(absl::StrCat(
      "an NCCL process group for ", device.str(),
      " needs a CUDA LibTorch with NCCL; this build has none (SPECSTREAM_WITH_TORCH_NCCL=0)"));
}
#endif

absl::StatusOr<c10::intrusive_ptr<CommGroup>> CreateDeviceGroup(
    const RendezvousOptions& options, c10::intrusive_ptr<c10d::Store> store, torch::Device device) {
  if (device.is_cuda()) return CreateNcclGroup(options, std::move(store), device);
  ASSIGN_OR_RETURN(ProcessGroupHandle handle, CreateGlooGroup(options, std::move(store)));
  return handle.group;
}

bool IsNarrowFloat(const torch::Tensor& tensor) {
  return tensor.scalar_type() == torch::kBFloat16 || tensor.scalar_type() == torch::kFloat16;
}

bool ReducesNarrowFloats(const CommGroup& group) {
  return SPECSTREAM_TORCH_2 || group.getBackendName() == "nccl";
}

bool HasReduceScatter(const CommGroup& group) {
  return SPECSTREAM_TORCH_2 || group.getBackendName() == "nccl";
}

absl::Status AllReduceSum(CommGroup& group, torch::Tensor& tensor) {
  return CatchTorch("all_reduce", [&] {
    const bool widen = IsNarrowFloat(tensor) && !ReducesNarrowFloats(group);
    std::vector<torch::Tensor> buffers{widen ? tensor.to(torch::kFloat32) : tensor.contiguous()};
    group.allreduce(buffers)->wait();
    if (buffers[0].data_ptr() != tensor.data_ptr()) tensor.copy_(buffers[0]);
  });
}

absl::StatusOr<torch::Tensor> ReduceScatterSum(CommGroup& group, const torch::Tensor& input) {
  const int64_t parts = group.getSize();
  if (input.dim() < 1 || input.size(0) % parts != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce_scatter: ", input.dim() < 1 ? 0 : input.size(0),
                     " rows do not split into ", parts, " parts"));
  }
  torch::Tensor output;
  RETURN_IF_ERROR(CatchTorch("reduce_scatter", [&] {
    const bool widen = IsNarrowFloat(input) && !ReducesNarrowFloats(group);
    torch::Tensor wire = widen ? input.to(torch::kFloat32) : input.contiguous();
    if (HasReduceScatter(group)) {
      std::vector<int64_t> shape = wire.sizes().vec();
      shape[0] /= parts;
      torch::Tensor part = torch::empty(shape, wire.options());
      group._reduce_scatter_base(part, wire)->wait();
      output = part;
    } else {
      // Gloo in 1.13: all-reduce the whole input, keep this rank's part.
      std::vector<torch::Tensor> buffers{wire.clone()};
      group.allreduce(buffers)->wait();
      const int64_t rows = wire.size(0) / parts;
      output = buffers[0].narrow(0, group.getRank() * rows, rows);
    }
    if (widen) output = output.to(input.scalar_type());
  }));
  return output;
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
    // Rows of two-byte floats travel as their bytes: exact, and every
    // backend moves bytes.
    const bool as_bytes = IsNarrowFloat(input);
    torch::Tensor send = input.contiguous();
    if (as_bytes) send = send.view(torch::kUInt8);
    int64_t rows = 0;
    for (int64_t r : recv_rows) rows += r;
    std::vector<int64_t> shape = send.sizes().vec();
    shape[0] = rows;
    torch::Tensor receive = torch::empty(shape, send.options());
    std::vector<int64_t> out_splits = recv_rows, in_splits = send_rows;
    group.alltoall_base(receive, send, out_splits, in_splits)->wait();
    output = as_bytes ? receive.view(input.scalar_type()) : receive;
  }));
  return output;
}

}  // namespace specstream
