#include "common/grpc/reflection.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace specstream {
namespace {

using google::protobuf::DescriptorPool;
using google::protobuf::FileDescriptor;
using grpc::reflection::v1alpha::ServerReflectionRequest;
using grpc::reflection::v1alpha::ServerReflectionResponse;

constexpr char kReflectionServiceName[] = "grpc.reflection.v1alpha.ServerReflection";
constexpr char kHealthServiceName[] = "grpc.health.v1.Health";

void SetError(ServerReflectionResponse& response, grpc::StatusCode code, std::string message) {
  response.mutable_error_response()->set_error_code(static_cast<int32_t>(code));
  response.mutable_error_response()->set_error_message(std::move(message));
}

// `file`, then each dependency (depth first) not in `sent`; all of them join
// `sent`, so a response describes each file once.
void AddFileAndDependencies(const FileDescriptor* file, absl::flat_hash_set<std::string>& sent,
                            ServerReflectionResponse& response) {
  if (!sent.insert(file->name()).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(response.mutable_file_descriptor_response()->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFileAndDependencies(file->dependency(i), sent, response);
  }
}

// The answer to one admitted request.
ServerReflectionResponse Answer(const ServerReflectionRequest& request,
                                const std::vector<std::string>& services) {
  const DescriptorPool& pool = *DescriptorPool::generated_pool();
  ServerReflectionResponse response;
  response.set_valid_host(request.host());
  *response.mutable_original_request() = request;
  const FileDescriptor* file = nullptr;
  std::string missing;
  switch (request.message_request_case()) {
    case ServerReflectionRequest::kListServices:
      for (const std::string& name : services) {
        response.mutable_list_services_response()->add_service()->set_name(name);
      }
      return response;
    case ServerReflectionRequest::kFileByFilename:
      file = pool.FindFileByName(request.file_by_filename());
      missing = absl::StrCat("file ", request.file_by_filename());
      break;
    case ServerReflectionRequest::kFileContainingSymbol:
      file = pool.FindFileContainingSymbol(request.file_containing_symbol());
      missing = absl::StrCat("symbol ", request.file_containing_symbol());
      break;
    case ServerReflectionRequest::kFileContainingExtension: {
      const auto& ask = request.file_containing_extension();
      const auto* type = pool.FindMessageTypeByName(ask.containing_type());
      const auto* extension =
          type == nullptr ? nullptr : pool.FindExtensionByNumber(type, ask.extension_number());
      if (extension != nullptr) file = extension->file();
      missing = absl::StrCat("extension ", ask.extension_number(), " of ", ask.containing_type());
      break;
    }
    case ServerReflectionRequest::kAllExtensionNumbersOfType: {
      const std::string& name = request.all_extension_numbers_of_type();
      const auto* type = pool.FindMessageTypeByName(name);
      if (type == nullptr) {
        SetError(response, grpc::StatusCode::NOT_FOUND, absl::StrCat("type ", name));
        return response;
      }
      std::vector<const google::protobuf::FieldDescriptor*> extensions;
      pool.FindAllExtensions(type, &extensions);
      auto* numbers = response.mutable_all_extension_numbers_response();
      numbers->set_base_type_name(name);
      for (const auto* extension : extensions) numbers->add_extension_number(extension->number());
      return response;
    }
    default:
      SetError(response, grpc::StatusCode::UNIMPLEMENTED, "no request in the message");
      return response;
  }
  if (file == nullptr) {
    SetError(response, grpc::StatusCode::NOT_FOUND, missing + ": not found");
    return response;
  }
  absl::flat_hash_set<std::string> sent;
  AddFileAndDependencies(file, sent, response);
  return response;
}

}  // namespace

ReflectionService::ReflectionService(std::vector<std::string> services, Authorize authorize)
    : services_(std::move(services)), authorize_(std::move(authorize)) {
  for (const char* name : {kHealthServiceName, kReflectionServiceName}) {
    if (std::find(services_.begin(), services_.end(), name) == services_.end()) {
      services_.push_back(name);
    }
  }
}

grpc::Status ReflectionService::ServerReflectionInfo(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<ServerReflectionResponse, ServerReflectionRequest>* stream) {
  if (authorize_) {
    if (grpc::Status verdict = authorize_(*context); !verdict.ok()) return verdict;
  }
  ServerReflectionRequest request;
  while (stream->Read(&request)) {
    if (!stream->Write(Answer(request, services_))) break;
  }
  return grpc::Status::OK;
}

}  // namespace specstream
