// libFuzzer target for the GGUF reader (common/gguf.h).
//
// Oracles: the reader never crashes or reads out of bounds (ASan); an
// accepted file's metadata serialises as JSON; a tensor dequantises exactly
// when the reader could size it, into exactly its element count.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/gguf.h"

namespace {

[[noreturn]] void Fail(const char* what, const std::string& name) {
  std::fprintf(stderr, "gguf_fuzz: %s (tensor \"%s\")\n", what, name.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using specstream::GgufFile;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto file = GgufFile::FromBytes(bytes);
  if (!file.ok()) return 0;
  const GgufFile& f = **file;
  (void)f.metadata().dump();  // throws on invalid UTF-8
  for (const specstream::GgufTensorInfo& t : f.tensors()) {
    auto values = f.Dequantize(t);
    if (values.ok() && static_cast<int64_t>(values->size()) != t.NumElements()) {
      Fail("dequantised element count", t.name);
    }
    if (values.ok() != (t.nbytes > 0)) Fail("dequantised a tensor it cannot size", t.name);
  }
  return 0;
}
