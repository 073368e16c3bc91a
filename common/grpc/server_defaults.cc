#include "common/grpc/server_defaults.h"

#include "absl/base/call_once.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/health_check_service_interface.h"

namespace specstream {

void EnableServerDefaults() {
  static absl::once_flag once;
  absl::call_once(once, [] {
    grpc::EnableDefaultHealthCheckService(true);
  });
}

std::string ListenAddress(absl::string_view host, int port) {
  const bool ipv6 = host.find(':') != absl::string_view::npos && host[0] != '[';
  return ipv6 ? absl::StrCat("[", host, "]:", port) : absl::StrCat(host, ":", port);
}

void SetServing(grpc::Server& server, bool serving,
                std::initializer_list<absl::string_view> services) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health == nullptr) return;
  for (absl::string_view service : services) {
    health->SetServingStatus(std::string(service), serving);
  }
  health->SetServingStatus(serving);
}

}  // namespace specstream
