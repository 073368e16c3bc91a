#include "common/crc32c.h"
#include "common/grpc/byte_buffer.h"
#include "common/transport/contract.h"
#include "common/transport/payload_sender.h"
#include "common/transport/shm_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace specstream {
namespace {

using ::testing::HasSubstr;

std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// The bytes of a ByteBuffer, concatenated.
std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// `bytes` cut into slices at random points (copied), as gRPC may deliver
// them.
grpc::ByteBuffer Split(std::mt19937_64& rng, const std::string& bytes) {
  std::vector<grpc::Slice> slices;
  size_t pos = 0;
  while (pos < bytes.size()) {
    size_t n = 1 + rng() % std::min<size_t>(bytes.size() - pos, rng() % 2 ? 7 : 4096);
    if (rng() % 8 == 0) slices.emplace_back(grpc::Slice());  // empty slices happen too
    slices.emplace_back(bytes.data() + pos, n);
    pos += n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// --- CRC32C ----------------------------------------------------------------

TEST(Crc32cTest, StandardVectors) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  // RFC 3720 (iSCSI) appendix B.4.
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, '\0'), down(32, '\0');
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(down), 0x113FDB5Cu);
  EXPECT_EQ(Crc32cExtendPortable(0, "123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32cExtendPortable(0, zeros.data(), zeros.size()), 0x8A9136AAu);
}

TEST(Crc32cTest, ExtendEqualsWholeAndPortableEqualsDispatch) {
  std::mt19937_64 rng(1);
  const std::string data = RandomBytes(rng, 10000);
  for (int trial = 0; trial < 200; ++trial) {
    // Misaligned starts and odd lengths exercise the head and tail loops.
    const size_t begin = rng() % 64, n = rng() % (data.size() - begin);
    const absl::string_view s(data.data() + begin, n);
    const uint32_t whole = Crc32c(s);
    ASSERT_EQ(Crc32cExtendPortable(0, s.data(), s.size()), whole) << begin << " " << n;
    const size_t cut = n == 0 ? 0 : rng() % n;
    EXPECT_EQ(Crc32cExtend(Crc32c(s.substr(0, cut)), s.substr(cut)), whole);
    EXPECT_EQ(Crc32cExtendPortable(Crc32c(s.substr(0, cut)), s.data() + cut, n - cut), whole);
  }
}

TEST(Crc32cTest, DetectsSingleBitFlips) {
  std::mt19937_64 rng(2);
  std::string data = RandomBytes(rng, 4096);
  const uint32_t crc = Crc32c(data);
  for (int i = 0; i < 100; ++i) {
    const size_t bit = rng() % (data.size() * 8);
    data[bit / 8] ^= static_cast<char>(1 << (bit % 8));
    EXPECT_NE(Crc32c(data), crc);
    data[bit / 8] ^= static_cast<char>(1 << (bit % 8));
  }
  EXPECT_EQ(Crc32c(data), crc);
}

// --- Contracts --------------------------------------------------------------------

TEST(ContractTest, DTypeRoundTrip) {
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16, DType::kI64, DType::kI32, DType::kU8,
                  DType::kBool}) {
    auto back = FromProtoDType(ToProtoDType(d));
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(*back, d);
  }
  EXPECT_EQ(FromProtoDType(v1::DTYPE_UNSPECIFIED).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromProtoDType(static_cast<v1::DType>(99)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ContractTest, MakeContractLaysOutBackToBackWithCrc) {
  std::mt19937_64 rng(3);
  const std::string ids = RandomBytes(rng, 5 * 4), hidden = RandomBytes(rng, 5 * 6 * 2),
                    mask = RandomBytes(rng, 5);
  const std::vector<PayloadTensor> tensors = {
      {"input_ids", DType::kI32, {5}, ids},
      {"aux_hidden", DType::kBF16, {5, 6}, hidden},
      {"loss_mask", DType::kU8, {5}, mask},
  };
  auto contract = MakeContract(tensors);
  ASSERT_TRUE(contract.ok()) << contract.status();
  ASSERT_EQ(contract->tensors_size(), 3);
  EXPECT_EQ(contract->tensors(0).offset(), 0u);
  EXPECT_EQ(contract->tensors(0).nbytes(), 20u);
  EXPECT_EQ(contract->tensors(1).name(), "aux_hidden");
  EXPECT_EQ(contract->tensors(1).dtype(), v1::DTYPE_BF16);
  EXPECT_THAT(contract->tensors(1).shape(), ::testing::ElementsAre(5, 6));
  EXPECT_EQ(contract->tensors(1).offset(), 20u);
  EXPECT_EQ(contract->tensors(1).nbytes(), 60u);
  EXPECT_EQ(contract->tensors(2).offset(), 80u);
  EXPECT_EQ(contract->payload_bytes(), 85u);
  const std::string whole = ids + hidden + mask;
  EXPECT_EQ(contract->crc32c(), Crc32c(whole));

  std::string packed(85, '\0');
  ASSERT_TRUE(PackPayload(tensors, absl::MakeSpan(packed)).ok());
  EXPECT_EQ(packed, whole);
  EXPECT_TRUE(ValidateContract(*contract).ok());
  EXPECT_TRUE(VerifyPayload(*contract, packed).ok());

  std::string short_out(84, '\0');
  EXPECT_EQ(PackPayload(tensors, absl::MakeSpan(short_out)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ContractTest, MakeContractRejectsBytesThatDoNotMatchTheShape) {
  const std::string bytes(10, 'x');
  auto contract = MakeContract({{"aux_hidden", DType::kBF16, {2, 3}, bytes}});
  EXPECT_EQ(contract.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(contract.status().message()), HasSubstr("aux_hidden"));
  EXPECT_THAT(std::string(contract.status().message()), HasSubstr("12"));
  EXPECT_EQ(MakeContract({{"x", DType::kF32, {-1}, ""}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  // An empty tensor list is not a valid contract.
  EXPECT_EQ(MakeContract({}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ContractTest, VerifyPayloadCatchesLengthAndCorruption) {
  std::mt19937_64 rng(4);
  const std::string bytes = RandomBytes(rng, 64);
  auto contract = MakeContract({{"h", DType::kF32, {16}, bytes}});
  ASSERT_TRUE(contract.ok());
  std::string corrupt = bytes;
  corrupt[17] ^= 4;
  absl::Status s = VerifyPayload(*contract, corrupt);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("crc32c"));
  s = VerifyPayload(*contract, bytes.substr(0, 60));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("payload_bytes"));
}

// An NCCL payload's contract: the same layout as MakeContract's, checked by
// the device checksum instead of the CRC32C.
TEST(ContractTest, DeviceContractIsCheckedByTheDeviceChecksum) {
  std::mt19937_64 rng(5);
  const std::string ids = RandomBytes(rng, 4 * 5), hidden = RandomBytes(rng, 2 * 5 * 6);
  const std::string whole = ids + hidden;
  auto host = MakeContract(
      {{"input_ids", DType::kI32, {5}, ids}, {"aux_hidden", DType::kBF16, {5, 6}, hidden}});
  auto device =
      MakeDeviceContract({{"input_ids", DType::kI32, {5}}, {"aux_hidden", DType::kBF16, {5, 6}}},
                         DeviceChecksumOf(whole));
  ASSERT_TRUE(host.ok() && device.ok()) << host.status() << device.status();
  EXPECT_TRUE(device->has_device_checksum());
  EXPECT_EQ(device->crc32c(), 0u);
  ASSERT_EQ(device->tensors_size(), host->tensors_size());
  for (int i = 0; i < device->tensors_size(); ++i) {
    EXPECT_EQ(device->tensors(i).offset(), host->tensors(i).offset());
    EXPECT_EQ(device->tensors(i).nbytes(), host->tensors(i).nbytes());
  }
  EXPECT_EQ(device->payload_bytes(), whole.size());
  EXPECT_TRUE(VerifyPayload(*device, whole).ok());
  std::string corrupt = whole;
  corrupt[31] ^= 1;
  const absl::Status s = VerifyPayload(*device, corrupt);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("device checksum"));
  // Shapes are checked as for any contract.
  EXPECT_EQ(MakeDeviceContract({{"x", DType::kF32, {-1}}}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A valid two-tensor contract that each rejection case breaks in one place.
v1::TensorContract GoodContract() {
  v1::TensorContract c;
  v1::TensorSpec* a = c.add_tensors();
  a->set_name("input_ids");
  a->set_dtype(v1::DTYPE_I32);
  a->add_shape(8);
  a->set_offset(0);
  a->set_nbytes(32);
  v1::TensorSpec* b = c.add_tensors();
  b->set_name("aux_hidden");
  b->set_dtype(v1::DTYPE_BF16);
  b->add_shape(8);
  b->add_shape(12);
  b->set_offset(32);
  b->set_nbytes(192);
  c.set_payload_bytes(224);
  return c;
}

TEST(ContractTest, ValidateAcceptsAGoodContract) {
  EXPECT_TRUE(ValidateContract(GoodContract()).ok());
  // Zero-size tensors are fine.
  v1::TensorContract c = GoodContract();
  c.mutable_tensors(1)->set_shape(0, 0);
  c.mutable_tensors(1)->set_nbytes(0);
  c.set_payload_bytes(32);
  EXPECT_TRUE(ValidateContract(c).ok()) << ValidateContract(c);
}

TEST(ContractTest, ValidateRejectionsNameTheField) {
  struct Case {
    const char* what;
    std::function<void(v1::TensorContract*)> edit;
    const char* expected;  // substring of the message
  };
  const std::vector<Case> cases = {
      {"no tensors", [](v1::TensorContract* c) { c->clear_tensors(); }, "contract.tensors: empty"},
      {"empty name", [](v1::TensorContract* c) { c->mutable_tensors(0)->set_name(""); },
       "contract.tensors[0] ().name"},
      {"bad name", [](v1::TensorContract* c) { c->mutable_tensors(1)->set_name("a/b"); },
       "contract.tensors[1] (a/b).name"},
      {"long name",
       [](v1::TensorContract* c) { c->mutable_tensors(1)->set_name(std::string(200, 'x')); },
       ".name: length 200"},
      {"duplicate", [](v1::TensorContract* c) { c->mutable_tensors(1)->set_name("input_ids"); },
       "contract.tensors[1] (input_ids).name: duplicate"},
      {"unspecified dtype",
       [](v1::TensorContract* c) { c->mutable_tensors(1)->set_dtype(v1::DTYPE_UNSPECIFIED); },
       "contract.tensors[1] (aux_hidden).dtype"},
      {"unknown dtype",
       [](v1::TensorContract* c) { c->mutable_tensors(0)->set_dtype(static_cast<v1::DType>(42)); },
       "contract.tensors[0] (input_ids).dtype"},
      {"rank",
       [](v1::TensorContract* c) {
         for (int i = 0; i < 8; ++i) c->mutable_tensors(1)->add_shape(1);
       },
       "contract.tensors[1] (aux_hidden).shape: rank 10"},
      {"negative dim", [](v1::TensorContract* c) { c->mutable_tensors(1)->set_shape(1, -12); },
       "contract.tensors[1] (aux_hidden).shape"},
      {"overflowing dims",
       [](v1::TensorContract* c) {
         c->mutable_tensors(1)->set_shape(0, int64_t{1} << 40);
         c->mutable_tensors(1)->set_shape(1, int64_t{1} << 40);
       },
       "contract.tensors[1] (aux_hidden).shape"},
      {"nbytes", [](v1::TensorContract* c) { c->mutable_tensors(1)->set_nbytes(191); },
       "contract.tensors[1] (aux_hidden).nbytes: 191 != 8 x 12 x 2 bytes (BF16)"},
      {"first offset", [](v1::TensorContract* c) { c->mutable_tensors(0)->set_offset(4); },
       "contract.tensors[0] (input_ids).offset: 4, expected 0"},
      {"gap", [](v1::TensorContract* c) { c->mutable_tensors(1)->set_offset(40); },
       "contract.tensors[1] (aux_hidden).offset: 40, expected 32"},
      {"payload_bytes", [](v1::TensorContract* c) { c->set_payload_bytes(225); },
       "contract.payload_bytes: 225 != 224"},
  };
  for (const Case& c : cases) {
    v1::TensorContract contract = GoodContract();
    c.edit(&contract);
    absl::Status s = ValidateContract(contract);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expected)) << c.what;
  }
}

TEST(ContractTest, ValidateAppliesLimits) {
  ContractLimits limits;
  limits.max_payload_bytes = 100;
  absl::Status s = ValidateContract(GoodContract(), limits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("contract.tensors[1] (aux_hidden).nbytes: payload would exceed"));
  limits = ContractLimits();
  limits.max_tensors = 1;
  s = ValidateContract(GoodContract(), limits);
  EXPECT_THAT(std::string(s.message()), HasSubstr("contract.tensors: 2 tensors, limit 1"));
}

// --- Framing ------------------------------------------------------------------------

v1::StreamResponse ChunkMessage(uint64_t request_id, uint64_t offset, const std::string& data) {
  v1::StreamResponse m;
  v1::StreamResponse::PayloadChunk* c = m.mutable_chunk();
  c->set_request_id(request_id);
  c->set_offset(offset);
  c->set_data(data);
  return m;
}

TEST(FrameTest, FramedChunkIsTheCanonicalSerializationAndReferencesThePayload) {
  std::mt19937_64 rng(5);
  const uint64_t ids[] = {0, 1, 127, 128, 300, uint64_t{1} << 35, ~uint64_t{0}};
  const size_t sizes[] = {0, 1, 127, 128, 16383, 16384, (size_t{1} << 20) + 3};
  for (uint64_t request_id : ids) {
    for (size_t size : sizes) {
      const uint64_t offset = rng() % 3 == 0 ? 0 : rng() >> (rng() % 64);
      auto payload = std::make_shared<std::string>(RandomBytes(rng, size + 10));
      const absl::string_view data(payload->data() + 5, size);
      grpc::ByteBuffer framed = FramePayloadChunk(request_id, offset, data, payload);

      const std::string expected =
          ChunkMessage(request_id, offset, std::string(data)).SerializeAsString();
      const std::string bytes = Flatten(framed);
      ASSERT_EQ(bytes, expected) << request_id << " " << offset << " " << size;
      v1::StreamResponse parsed;
      ASSERT_TRUE(parsed.ParseFromString(bytes));
      ASSERT_EQ(parsed.kind_case(), v1::StreamResponse::kChunk);
      EXPECT_EQ(parsed.chunk().request_id(), request_id);
      EXPECT_EQ(parsed.chunk().offset(), offset);
      EXPECT_EQ(parsed.chunk().data(), data);

      // Zero copy: the data slice is the payload memory itself.
      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(framed.Dump(&slices).ok());
      if (size > 0) {
        ASSERT_EQ(slices.size(), 2u);
        EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), data.data());
        EXPECT_LE(slices[0].size(), kMaxChunkHeaderBytes);
      }
    }
  }
}

TEST(FrameTest, KeepsThePayloadAliveUntilTheLastSliceIsGone) {
  auto payload = std::make_shared<std::string>(1000, 'p');
  std::weak_ptr<std::string> weak = payload;
  grpc::ByteBuffer framed = FramePayloadChunk(7, 0, *payload, payload);
  payload.reset();
  EXPECT_FALSE(weak.expired());
  grpc::ByteBuffer copy(framed);  // gRPC copies buffers by reference
  framed.Clear();
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(Flatten(copy), ChunkMessage(7, 0, std::string(1000, 'p')).SerializeAsString());
  copy.Clear();
  EXPECT_TRUE(weak.expired());
}

TEST(FrameTest, SerializeToByteBufferRoundTrips) {
  v1::StreamResponse m;
  m.mutable_header()->set_request_id(3);
  m.mutable_header()->set_sample_id(44);
  *m.mutable_header()->mutable_contract() = GoodContract();
  auto buffer = SerializeToByteBuffer(m);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(Flatten(*buffer), m.SerializeAsString());
}

TEST(DecodeTest, FramedChunksDecodeByHandAcrossAnySlicing) {
  std::mt19937_64 rng(6);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t size = trial % 10 == 0 ? 0 : rng() % 70000;
    const uint64_t request_id = rng() % 4 == 0 ? 0 : rng() >> (rng() % 64);
    const uint64_t offset = rng() % 4 == 0 ? 0 : rng() >> (rng() % 64);
    auto payload = std::make_shared<std::string>(RandomBytes(rng, size));
    grpc::ByteBuffer framed = FramePayloadChunk(request_id, offset, *payload, payload);
    // As sent (header + data slices) and as a receiver may get it.
    grpc::ByteBuffer received = trial % 2 ? framed : Split(rng, Flatten(framed));

    v1::StreamResponse message;
    message.mutable_error()->set_code(5);  // must stay untouched
    ReceivedChunk chunk;
    auto is_chunk = DecodeStreamResponse(received, &message, &chunk);
    ASSERT_TRUE(is_chunk.ok()) << is_chunk.status();
    ASSERT_TRUE(*is_chunk);
    EXPECT_TRUE(chunk.zero_copy());
    EXPECT_EQ(chunk.shm(), nullptr);
    EXPECT_EQ(chunk.request_id(), request_id);
    EXPECT_EQ(chunk.offset(), offset);
    ASSERT_EQ(chunk.size(), size);
    std::string out(size, '\0');
    chunk.CopyTo(out.data());
    EXPECT_EQ(out, *payload);
    EXPECT_EQ(message.error().code(), 5);
  }
}

// A random StreamResponse of any kind (or none), with zero and extreme values.
v1::StreamResponse RandomResponse(std::mt19937_64& rng) {
  auto u64 = [&] { return rng() % 3 == 0 ? 0 : rng() >> (rng() % 64); };
  v1::StreamResponse m;
  switch (rng() % 5) {
    case 0:
      m.mutable_opened()->set_transport(static_cast<v1::Transport>(rng() % 4));
      m.mutable_opened()->set_chunk_bytes(u64());
      break;
    case 1: {
      v1::StreamResponse::SampleHeader* h = m.mutable_header();
      h->set_request_id(u64());
      h->set_sample_id(static_cast<int64_t>(u64()));
      if (rng() % 2) *h->mutable_contract() = GoodContract();
      h->set_row_begin(static_cast<int64_t>(rng() % 100));
      h->set_row_end(static_cast<int64_t>(rng() % 1000));
      break;
    }
    case 2:
      if (rng() % 4 == 0) {  // an shm chunk: a ring locator instead of data
        m.mutable_chunk()->set_request_id(u64());
        m.mutable_chunk()->set_offset(u64());
        m.mutable_chunk()->mutable_shm()->set_position(u64());
        m.mutable_chunk()->mutable_shm()->set_length(u64());
      } else {
        *m.mutable_chunk() =
            ChunkMessage(u64(), u64(), RandomBytes(rng, rng() % 2 ? rng() % 50 : rng() % 20000))
                .chunk();
      }
      break;
    case 3:
      m.mutable_error()->set_request_id(u64());
      m.mutable_error()->set_code(static_cast<int32_t>(rng() % 17));
      m.mutable_error()->set_message(
          std::string(rng() % 30, static_cast<char>('a' + rng() % 26)));  // string: UTF-8
      break;
    default:
      break;  // no kind set
  }
  return m;
}

TEST(DecodeTest, HandDecoderAgreesWithTheProtobufParser) {
  std::mt19937_64 rng(7);
  int zero_copy = 0, parsed_chunks = 0, shm_chunks = 0, others = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    // Concatenated serializations are valid protobuf (they merge; for the
    // oneof, the last member wins), and so are unknown fields: both must
    // decode exactly as ParseFromString decodes them.
    std::string bytes;
    const int parts = trial % 3 == 0 ? 1 + rng() % 3 : 1;
    for (int p = 0; p < parts; ++p) bytes += RandomResponse(rng).SerializeAsString();
    if (rng() % 10 == 0) bytes += std::string("\xa0\x06\x2a", 3);  // field 100 = 42
    v1::StreamResponse expected;
    ASSERT_TRUE(expected.ParseFromString(bytes));

    v1::StreamResponse message;
    ReceivedChunk chunk;
    auto is_chunk = DecodeStreamResponse(Split(rng, bytes), &message, &chunk);
    ASSERT_TRUE(is_chunk.ok()) << is_chunk.status();
    if (expected.kind_case() == v1::StreamResponse::kChunk) {
      ASSERT_TRUE(*is_chunk) << trial;
      EXPECT_EQ(chunk.request_id(), expected.chunk().request_id());
      EXPECT_EQ(chunk.offset(), expected.chunk().offset());
      EXPECT_EQ(chunk.ToString(), expected.chunk().data());
      ASSERT_EQ(chunk.shm() != nullptr, expected.chunk().has_shm());
      if (chunk.shm() != nullptr) {
        EXPECT_EQ(chunk.shm()->position(), expected.chunk().shm().position());
        EXPECT_EQ(chunk.shm()->length(), expected.chunk().shm().length());
        ++shm_chunks;
      }
      (chunk.zero_copy() ? zero_copy : parsed_chunks)++;
    } else {
      ASSERT_FALSE(*is_chunk) << trial;
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(message, expected)) << trial;
      others++;
    }
  }
  // Both decoder paths and non-chunk messages were exercised.
  EXPECT_GT(zero_copy, 100);
  EXPECT_GT(parsed_chunks, 10);
  EXPECT_GT(shm_chunks, 50);
  EXPECT_GT(others, 500);
}

TEST(DecodeTest, RejectsBytesThatDoNotParse) {
  const std::string truncated = ChunkMessage(1, 2, "hello").SerializeAsString().substr(0, 6);
  for (const std::string& bytes :
       {truncated, std::string("\x1a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 11),
        std::string("\x07", 1)}) {
    grpc::Slice slice(bytes.data(), bytes.size());
    grpc::ByteBuffer buffer(&slice, 1);
    v1::StreamResponse message;
    ReceivedChunk chunk;
    EXPECT_EQ(DecodeStreamResponse(buffer, &message, &chunk).status().code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(DecodeTest, EmptyBufferIsAMessageWithNoKind) {
  grpc::ByteBuffer empty;
  v1::StreamResponse message;
  message.mutable_opened()->set_chunk_bytes(3);
  ReceivedChunk chunk;
  auto is_chunk = DecodeStreamResponse(empty, &message, &chunk);
  ASSERT_TRUE(is_chunk.ok());
  EXPECT_FALSE(*is_chunk);
  EXPECT_EQ(message.kind_case(), v1::StreamResponse::KIND_NOT_SET);
}

// --- Senders ------------------------------------------------------------------------

// A PayloadStream that keeps what a sender emits.
class RecordingStream final : public PayloadStream {
 public:
  absl::Status Emit(StreamMessage message) override {
    messages.push_back(std::move(message));
    return absl::OkStatus();
  }
  bool stopped() const override { return false; }

  std::vector<StreamMessage> messages;
};

// P13 item 6: a local process that truncated the student's ring after the
// teacher attached it killed the teacher with SIGBUS. The shm sender now
// fails that Send with DataLoss (which ends the stream, teacher/
// stream_session.cc) and emits no locator for the record it could not write.
TEST(ShmSenderTest, ARingTruncatedAfterOpenFailsTheSendWithDataLoss) {
  ShmRingOptions options;
  options.name = absl::StrCat("/specstream-payload-test-", getpid());
  options.capacity = 16384;
  absl::StatusOr<std::unique_ptr<ShmRing>> ring = ShmRing::Create(options);
  ASSERT_TRUE(ring.ok()) << ring.status();
  v1::StreamRequest::Open open;
  open.set_transport(v1::TRANSPORT_SHM);
  open.set_shm_name(options.name);
  open.set_shm_capacity(options.capacity);
  PayloadSenderConfig config;
  config.chunk_bytes = kMinChunkBytes;
  absl::StatusOr<std::unique_ptr<PayloadSender>> sender = OpenPayloadSender(open, config);
  ASSERT_TRUE(sender.ok()) << sender.status();

  const std::string bytes(10000, 'p');
  const PayloadBytes payload({bytes}, nullptr);
  RecordingStream stream;
  ASSERT_TRUE((*sender)->Send(1, payload, stream).ok());
  ASSERT_EQ(stream.messages.size(), 3u);  // 4096 + 4096 + 1808 bytes
  std::string received;
  for (const StreamMessage& m : stream.messages) {
    const v1::StreamResponse::ShmLocator& shm = m.message.chunk().shm();
    std::string record(shm.length(), '\0');
    ASSERT_TRUE(
        (*ring)->CopyOut(shm.position(), absl::Span<char>(record.data(), record.size())).ok());
    ASSERT_TRUE((*ring)->Release(shm.position() + shm.length()).ok());
    received += record;
  }
  EXPECT_EQ(received, bytes);

  const int fd = shm_open(options.name.c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 0), 0);
  close(fd);
  const absl::Status sent = (*sender)->Send(2, payload, stream);
  EXPECT_EQ(sent.code(), absl::StatusCode::kDataLoss) << sent;
  EXPECT_THAT(std::string(sent.message()), HasSubstr(options.name));
  EXPECT_THAT(std::string(sent.message()), HasSubstr("truncated"));
  EXPECT_EQ(stream.messages.size(), 3u);
}

}  // namespace
}  // namespace specstream
