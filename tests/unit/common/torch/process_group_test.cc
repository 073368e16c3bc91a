#include "common/torch/process_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "common/logging.h"
#include "common/torch/compat.h"
#include "gtest/gtest.h"

namespace specstream {
namespace {

// Serves a rendezvous store in a child process. Closing its sockets with
// SO_LINGER 0 (Kill) resets every connection to it, as the kernel does when
// rank 0's process is killed with bytes unread.
class StoreProcess {
 public:
  StoreProcess() {
    int to_parent[2], to_child[2];
    if (pipe(to_parent) != 0 || pipe(to_child) != 0) std::abort();
    pid_ = fork();
    if (pid_ == 0) {
      close(to_parent[0]);
      close(to_child[1]);
      RendezvousOptions options;
      options.world_size = 2;
      int port = 0;
      auto store = CreateTcpStore(options, &port);
      if (!store.ok()) _exit(1);
      if (write(to_parent[1], &port, sizeof(port)) != sizeof(port)) _exit(1);
      char go;
      if (read(to_child[0], &go, 1) != 1) _exit(1);
      for (int fd = 3; fd < 1024; ++fd) {
        linger reset{1, 0};
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
      }
      _exit(0);
    }
    close(to_parent[1]);
    close(to_child[0]);
    if (read(to_parent[0], &port_, sizeof(port_)) != sizeof(port_)) port_ = -1;
    close(to_parent[0]);
    go_ = to_child[1];
  }
  ~StoreProcess() {
    close(go_);
    waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }
  // Ends the server, resetting every connection.
  void Reset() {
    const char go = 1;
    if (write(go_, &go, 1) != 1) std::abort();
    waitpid(pid_, nullptr, 0);
  }

 private:
  pid_t pid_ = -1;
  int port_ = -1;
  int go_ = -1;
};

// A client rank whose store goes away while it holds it ends with
// UNAVAILABLE's exit code and a message naming the store, not with
// "terminate called" (LibTorch 1.13's watch thread throws on the reset).
TEST(ProcessGroupDeathTest, StoreResetEndsAClientRankWithANamedError) {
  if (SPECSTREAM_TORCH_2) GTEST_SKIP() << "LibTorch 2.x's store client has no watch thread";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        InitLogging({.role = "student", .rank = 1});
        StoreProcess server;
        RendezvousOptions options;
        options.world_size = 2;
        options.rank = 1;
        options.master_port = server.port();
        auto store = CreateTcpStore(options);
        if (!store.ok()) std::exit(10);
#if !SPECSTREAM_TORCH_2
        // watchKey returns once the server has accepted and registered the
        // watch connection, so the reset below reaches it: a connection still
        // in the accept queue when the server's sockets are marked would
        // close with an orderly FIN, which the watch thread ignores.
        (*store)->watchKey("never-set",
                           [](c10::optional<std::string>, c10::optional<std::string>) {});
#endif
        server.Reset();
        // The main thread does not touch the store: only the watch thread
        // sees the reset, and the process must end within these 20 s.
        poll(nullptr, 0, 20000);
        std::exit(11);
      },
      testing::ExitedWithCode(3),
      "rendezvous at 127.0.0.1:[0-9]+: lost the connection to the store");
}

}  // namespace
}  // namespace specstream
