#include "common/grpc/auth.h"

#include <cstdlib>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "openssl/rand.h"
#include "openssl/sha.h"

namespace specstream {
namespace {

constexpr absl::string_view kAuthorizationKey = "authorization";
constexpr absl::string_view kBearerScheme = "Bearer";

// gRPC rejects metadata values outside printable ASCII at call time with an
// opaque error; refusing such a token when it is loaded names its source.
absl::Status ValidateToken(absl::string_view token, absl::string_view source) {
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the token may only hold visible ASCII characters"));
    }
  }
  return absl::OkStatus();
}

// Reads one PEM file for the TLS field `field` ("tls.key"); errors name the
// field and the path.
absl::StatusOr<std::string> ReadPem(absl::string_view field, const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFileToString(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", contents.status().message()));
  }
  // Catches a swapped or truncated path early; gRPC itself would only fail
  // at BuildAndStart / the first handshake with a less helpful message.
  if (!absl::StrContains(*contents, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", path, " is not a PEM file"));
  }
  return contents;
}

}  // namespace

bool TokenMatches(absl::string_view expected, absl::string_view got) {
  unsigned diff = expected.size() == got.size() ? 0u : 1u;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char g = i < got.size() ? static_cast<unsigned char>(got[i]) : 0u;
    diff |= static_cast<unsigned char>(expected[i]) ^ g;
  }
  return diff == 0;
}

std::string TokenHash(absl::string_view token) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), digest);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), sizeof(digest)));
}

std::string RandomToken(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  // RAND_bytes draws from the OS CSPRNG; failure means no entropy source,
  // which no caller can recover from.
  if (RAND_bytes(reinterpret_cast<unsigned char*>(raw.data()), bytes) != 1) std::abort();
  return absl::BytesToHexString(raw);
}

absl::StatusOr<std::string> LoadToken(const std::string& token_file) {
  if (!token_file.empty()) {
    absl::StatusOr<std::string> contents = ReadFileToString(token_file);
    if (!contents.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("token file: ", contents.status().message()));
    }
    std::string token(absl::StripAsciiWhitespace(*contents));
    if (token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("token file ", token_file, " is empty"));
    }
    if (absl::Status s = ValidateToken(token, absl::StrCat("token file ", token_file)); !s.ok()) {
      return s;
    }
    return token;
  }
  const char* env = std::getenv(kTokenEnvVar);
  if (env == nullptr) return std::string();
  std::string token(absl::StripAsciiWhitespace(env));
  if (absl::Status s = ValidateToken(token, kTokenEnvVar); !s.ok()) return s;
  return token;
}

absl::Status CheckTlsServerFlags(const TlsServerFiles& files) {
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key: give both or neither");
  }
  if (!files.client_ca.empty() && files.cert.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca: needs --tls-cert and --tls-key");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsServerFiles& files) {
  if (files.cert.empty()) {
    // A key or client CA without a certificate would silently serve
    // plaintext to an operator who asked for TLS.
    if (!files.key.empty() || !files.client_ca.empty()) {
      return absl::InvalidArgumentError("tls.cert: required with tls.key or tls.client_ca");
    }
    return grpc::InsecureServerCredentials();
  }
  if (files.key.empty()) return absl::InvalidArgumentError("tls.key: required with tls.cert");
  absl::StatusOr<std::string> cert = ReadPem("tls.cert", files.cert);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("tls.key", files.key);
  if (!key.ok()) return key.status();

  std::string client_ca;
  if (!files.client_ca.empty()) {
    absl::StatusOr<std::string> ca = ReadPem("tls.client_ca", files.client_ca);
    if (!ca.ok()) return ca.status();
    client_ca = *std::move(ca);
  }
  grpc::SslServerCredentialsOptions options(
      client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                        : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = std::move(client_ca);
  options.pem_key_cert_pairs.push_back({*std::move(key), *std::move(cert)});
  return grpc::SslServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsClientFiles& files) {
  if (files.ca.empty()) {
    if (!files.cert.empty() || !files.key.empty()) {
      return absl::InvalidArgumentError("tls.ca: required with tls.cert or tls.key");
    }
    return grpc::InsecureChannelCredentials();
  }
  if (files.cert.empty() != files.key.empty()) {
    return absl::InvalidArgumentError(files.cert.empty() ? "tls.cert: required with tls.key"
                                                         : "tls.key: required with tls.cert");
  }
  grpc::SslCredentialsOptions options;
  absl::StatusOr<std::string> ca = ReadPem("tls.ca", files.ca);
  if (!ca.ok()) return ca.status();
  options.pem_root_certs = *std::move(ca);
  if (!files.cert.empty()) {
    absl::StatusOr<std::string> cert = ReadPem("tls.cert", files.cert);
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadPem("tls.key", files.key);
    if (!key.ok()) return key.status();
    options.pem_cert_chain = *std::move(cert);
    options.pem_private_key = *std::move(key);
  }
  return grpc::SslCredentials(options);
}

void AddBearer(grpc::ClientContext& context, absl::string_view token) {
  if (token.empty()) return;
  context.AddMetadata(std::string(kAuthorizationKey), absl::StrCat(kBearerScheme, " ", token));
}

std::optional<std::string> BearerToken(const grpc::ServerContextBase& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(kAuthorizationKey.data(), kAuthorizationKey.size()));
  if (it == metadata.end()) return std::nullopt;
  absl::string_view value(it->second.data(), it->second.size());
  // The scheme is case-insensitive (RFC 7235 section 2.1).
  if (value.size() <= kBearerScheme.size() ||
      !absl::EqualsIgnoreCase(value.substr(0, kBearerScheme.size()), kBearerScheme) ||
      value[kBearerScheme.size()] != ' ') {
    return std::nullopt;
  }
  absl::string_view token = absl::StripAsciiWhitespace(value.substr(kBearerScheme.size() + 1));
  if (token.empty()) return std::nullopt;
  return std::string(token);
}

grpc::Status CheckBearer(const grpc::ServerContextBase& context, absl::string_view expected) {
  if (expected.empty()) return grpc::Status::OK;
  std::optional<std::string> token = BearerToken(context);
  if (!token.has_value()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing bearer token");
  }
  if (!TokenMatches(expected, *token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong bearer token");
  }
  return grpc::Status::OK;
}

}  // namespace specstream
