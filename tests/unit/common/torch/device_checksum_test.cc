#include "common/torch/device_checksum.h"

#include <cstdint>
#include <random>
#include <vector>

#include "common/transport/contract.h"
#include "gtest/gtest.h"

namespace specstream {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(n);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

absl::string_view AsText(const std::vector<uint8_t>& bytes) {
  return absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

uint64_t OfTensor(const std::vector<uint8_t>& bytes) {
  torch::Tensor t = torch::from_blob(const_cast<uint8_t*>(bytes.data()),
                                     {static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  return static_cast<uint64_t>(DeviceChecksum(t).item<int64_t>());
}

// The tensor computation equals the word-by-word definition (payload.h), for odd and
// even lengths and across the 2^22-word chunks.
TEST(DeviceChecksumTest, MatchesTheDefinition) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{1001}, size_t{65521 * 2 + 5},
                   (size_t{1} << 23) + 7}) {
    const std::vector<uint8_t> bytes = RandomBytes(n, static_cast<uint32_t>(n));
    EXPECT_EQ(OfTensor(bytes), DeviceChecksumOf(AsText(bytes))) << n << " bytes";
  }
  EXPECT_EQ(DeviceChecksumOf(""), 0u);
  // One word 0x0201 at weight 1: A = B = 0x0201; then 0x03 at weight 2.
  EXPECT_EQ(DeviceChecksumOf(std::string("\x01\x02")), (uint64_t{0x0201} << 32) | 0x0201);
  EXPECT_EQ(DeviceChecksumOf(std::string("\x01\x02\x03")),
            (uint64_t{0x0201 + 2 * 3} << 32) | (0x0201 + 3));
}

// What a broken transfer does to a payload changes the checksum.
TEST(DeviceChecksumTest, CatchesFlippedZeroedAndSwappedWords) {
  const std::vector<uint8_t> bytes = RandomBytes(4096, 7);
  const uint64_t good = OfTensor(bytes);
  std::vector<uint8_t> flipped = bytes;
  flipped[1234] ^= 0x10;
  EXPECT_NE(OfTensor(flipped), good);
  std::vector<uint8_t> zeroed = bytes;
  std::fill(zeroed.begin() + 1024, zeroed.begin() + 2048, 0);
  EXPECT_NE(OfTensor(zeroed), good);
  std::vector<uint8_t> swapped = bytes;
  std::swap_ranges(swapped.begin(), swapped.begin() + 512, swapped.begin() + 512);
  EXPECT_NE(OfTensor(swapped), good);
}

TEST(DeviceChecksumTest, RefusesWhatIsNotABytesVector) {
  EXPECT_THROW(DeviceChecksum(torch::zeros({4}, torch::kInt32)), c10::Error);
  EXPECT_THROW(DeviceChecksum(torch::zeros({2, 2}, torch::kUInt8)), c10::Error);
}

}  // namespace
}  // namespace specstream
