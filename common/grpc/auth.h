// Bearer tokens and TLS for SpecStream's gRPC services.
//
// Clients attach `authorization: Bearer <token>` metadata (AddBearer); servers
// check it at the top of each handler (CheckBearer) and answer
// UNAUTHENTICATED when it is missing or wrong. Tokens come from a file
// (`--token-file`) or the SPECSTREAM_TOKEN environment variable.
//
// TLS is optional: a server with a certificate and key serves TLS only; with a
// client CA as well it also requires and verifies client certificates.
// Clients given a CA file verify the server against it.
//
// Pure functions; thread-safe.
#ifndef SPECSTREAM_COMMON_GRPC_AUTH_H_
#define SPECSTREAM_COMMON_GRPC_AUTH_H_

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_context.h"

namespace specstream {

inline constexpr char kTokenEnvVar[] = "SPECSTREAM_TOKEN";

// The token in `token_file` (surrounding whitespace trimmed) when the path is
// non-empty, else $SPECSTREAM_TOKEN, else "" (no token). An unreadable or
// empty file, or a token with characters outside visible ASCII (which gRPC
// metadata cannot carry), is InvalidArgument naming the path (or variable).
absl::StatusOr<std::string> LoadToken(const std::string& token_file);

struct TlsServerFiles {
  std::string cert;       // PEM certificate chain; empty: plaintext
  std::string key;        // PEM private key (required with cert)
  std::string client_ca;  // PEM CA bundle; set: clients must present a cert it signed
};

struct TlsClientFiles {
  std::string ca;    // PEM roots to verify the server; empty: plaintext
  std::string cert;  // client certificate for mutual TLS (optional)
  std::string key;
};

// The server TLS files given in a usable combination, as flags
// (--tls-cert, --tls-key, --tls-client-ca): cert and key both or neither, a
// client CA only with them. Reads no file (--check-config runs it).
absl::Status CheckTlsServerFlags(const TlsServerFiles& files);

// Insecure credentials when `files.cert` (server) / `files.ca` (client) is
// empty. Unreadable or non-PEM files, a cert without a key (or the reverse),
// and a key / CA given without the file that turns TLS on are
// InvalidArgument naming the flag-like field ("tls.key: ...").
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerFiles& files);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsClientFiles& files);

// Whether `got` equals `expected`, in time that depends only on
// `expected`'s length (a client cannot learn a token a byte at a time).
bool TokenMatches(absl::string_view expected, absl::string_view got);

// The lowercase hex SHA-256 of `token`: what the coordinator stores and
// hands to teachers instead of a job token.
std::string TokenHash(absl::string_view token);

// A fresh random token: `bytes` bytes from the OS's CSPRNG, as hex.
std::string RandomToken(int bytes = 16);

// Adds "authorization: Bearer <token>"; no-op for an empty token.
void AddBearer(grpc::ClientContext& context, absl::string_view token);

// The bearer token the client sent in "authorization: Bearer <token>" (the
// scheme matched case-insensitively), if any.
std::optional<std::string> BearerToken(const grpc::ServerContextBase& context);

// OK when `expected` is empty (auth off) or the client sent exactly it
// (compared in constant time); UNAUTHENTICATED otherwise ("missing bearer
// token" / "wrong bearer token").
grpc::Status CheckBearer(const grpc::ServerContextBase& context, absl::string_view expected);

}  // namespace specstream

#endif  // SPECSTREAM_COMMON_GRPC_AUTH_H_
