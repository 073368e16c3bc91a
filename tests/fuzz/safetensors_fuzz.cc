// libFuzzer target for the safetensors reader.
//
// Oracles: the reader never crashes; every view of an accepted file lies
// inside the data region and holds exactly elements × dtype size bytes; and an
// accepted file re-serialised by SafetensorsWriter parses back to the same
// tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/safetensors.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& name) {
  std::fprintf(stderr, "safetensors_fuzz: %s (tensor \"%s\")\n", what, name.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using specstream::SafetensorsFile;
  auto file = SafetensorsFile::FromBytes(std::string(reinterpret_cast<const char*>(data), size));
  if (!file.ok()) return 0;
  const SafetensorsFile& f = **file;
  const uint8_t* region_begin = f.bytes() + f.data_start();
  const uint8_t* region_end = f.bytes() + f.size();
  if (f.data_start() > f.size()) Fail("data start past the end", "");

  specstream::SafetensorsWriter writer;
  size_t covered = 0;
  for (const std::string& name : f.names()) {
    auto view = f.Get(name);
    if (!view.ok()) Fail("Get failed for a listed name", name);
    if (view->data == nullptr) Fail("null data", name);
    if (view->data < region_begin || view->data > region_end ||
        view->nbytes > static_cast<size_t>(region_end - view->data)) {
      Fail("view outside the data region", name);
    }
    auto elements = specstream::NumElements(view->shape);
    if (!elements.ok() || *elements * specstream::DTypeSize(view->dtype) != view->nbytes) {
      Fail("byte count does not match shape", name);
    }
    covered += view->nbytes;
    if (!writer.Add(name, view->dtype, view->shape, view->data, view->nbytes).ok()) {
      Fail("writer refused an accepted tensor", name);
    }
  }
  if (covered != static_cast<size_t>(region_end - region_begin)) Fail("data not covered", "");
  for (const auto& [key, value] : f.metadata()) writer.SetMetadata(key, value);

  auto bytes = writer.Serialize();
  if (!bytes.ok()) Fail("serialize failed", "");
  auto again = SafetensorsFile::FromBytes(*bytes);
  if (!again.ok()) Fail("re-serialised file refused", "");
  if (again.value()->names().size() != f.names().size()) Fail("tensor count changed", "");
  if (again.value()->metadata() != f.metadata()) Fail("metadata changed", "");
  for (const std::string& name : f.names()) {
    auto a = f.Get(name);
    auto b = again.value()->Get(name);
    if (!b.ok() || b->dtype != a->dtype || b->shape != a->shape || b->nbytes != a->nbytes ||
        (a->nbytes > 0 && std::memcmp(a->data, b->data, a->nbytes) != 0)) {
      Fail("round trip changed the tensor", name);
    }
  }
  return 0;
}
