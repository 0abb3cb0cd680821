// Byte-level tokenizer: exact round trips, the EOT token, range checks, printable output.
#include "trainer/tokenizer.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tier/error.hpp"

using ght::trainer::ByteTokenizer;

TEST(ByteTokenizer, RoundTripsEveryByteValue) {
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  std::mt19937 rng(7);
  for (int i = 0; i < 1000; ++i) all.push_back(static_cast<char>(rng() & 0xFF));
  const auto ids = ByteTokenizer::encode(all);
  ASSERT_EQ(ids.size(), all.size());
  for (std::size_t i = 0; i < 256; ++i) EXPECT_EQ(ids[i], i);
  EXPECT_EQ(ByteTokenizer::decode(ids), all);
}

TEST(ByteTokenizer, Utf8TextRoundTrips) {
  const std::string text = "It is a truth universally acknowledged \xC2\xA3 caf\xC3\xA9 \xE2\x80\x94 \xF0\x9F\x98\x80\n";
  const auto ids = ByteTokenizer::encode(text);
  EXPECT_EQ(ids.size(), text.size());  // one token per byte, not per character
  EXPECT_EQ(ids[0], static_cast<std::uint32_t>('I'));
  EXPECT_EQ(ByteTokenizer::decode(ids), text);
  std::vector<std::int32_t> i32(ids.begin(), ids.end());
  EXPECT_EQ(ByteTokenizer::decode(i32), text);
}

TEST(ByteTokenizer, EotIsByteZeroAndCanBeSkipped) {
  EXPECT_EQ(ByteTokenizer::kEot, 0u);
  EXPECT_EQ(ByteTokenizer::kVocab, 256);
  const std::vector<std::uint32_t> ids = {0, 'a', 'b', 0, 'c'};
  EXPECT_EQ(ByteTokenizer::decode(ids, /*skip_eot=*/true), "abc");
  EXPECT_EQ(ByteTokenizer::decode(ids).size(), 5u);
}

TEST(ByteTokenizer, DecodeRejectsOutOfVocabularyTokens) {
  const std::vector<std::uint32_t> ids = {'a', 'b', 256};
  try {
    (void)ByteTokenizer::decode(ids);
    FAIL() << "expected an error";
  } catch (const ght::logic_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("256"), std::string::npos) << msg;
    EXPECT_NE(msg.find("index 2"), std::string::npos) << msg;
  }
  const std::vector<std::int32_t> neg = {-1};
  EXPECT_THROW((void)ByteTokenizer::decode(neg), ght::logic_error);
}

TEST(ByteTokenizer, PrintableKeepsValidUtf8AndReplacesTheRest) {
  const std::string ok = "line one\n\tcaf\xC3\xA9 \xE2\x82\xAC";
  EXPECT_EQ(ByteTokenizer::printable(ok), ok);
  const std::string repl = "\xEF\xBF\xBD";
  EXPECT_EQ(ByteTokenizer::printable(std::string("a\x01z", 3)), "a" + repl + "z");
  EXPECT_EQ(ByteTokenizer::printable("a\xC3"), "a" + repl);           // truncated sequence
  EXPECT_EQ(ByteTokenizer::printable("\xC0\xAF"), repl + repl);       // overlong '/'
  EXPECT_EQ(ByteTokenizer::printable("\xED\xA0\x80"), repl + repl + repl);  // surrogate
  EXPECT_EQ(ByteTokenizer::printable(std::string("\x1b[2J", 4)), repl + "[2J");  // no escapes
}
