#pragma once
/**
 * @file tokenizer.hpp
 * @brief The built-in byte-level tokenizer: one token per byte, vocabulary 256.
 *
 * Token id = byte value (0..255), so any UTF-8 (or binary) text round-trips exactly. Byte 0 (NUL)
 * never occurs in text, so it doubles as the end-of-text / document separator: `ght prep` writes
 * it before every document (llm.c's convention: EOT starts a document), and the data loader can
 * derive document boundaries from it.
 */
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ght::trainer {

class ByteTokenizer {
 public:
  static constexpr int kVocab = 256;
  /// The document separator: byte 0, which `ght prep` rejects inside text inputs.
  static constexpr std::uint32_t kEot = 0;

  /// @brief Bytes of `text` as token ids (no EOT is added).
  [[nodiscard]] static std::vector<std::uint32_t> encode(std::string_view text);

  /// @brief Tokens back to bytes.
  /// @param skip_eot drop EOT tokens instead of emitting a NUL byte (for printing samples)
  /// @throws ght::logic_error naming the index and value of a token >= 256
  [[nodiscard]] static std::string decode(std::span<const std::uint32_t> tokens,
                                          bool skip_eot = false);
  [[nodiscard]] static std::string decode(std::span<const std::int32_t> tokens,
                                          bool skip_eot = false);

  /// @brief Text made safe for a terminal: invalid UTF-8 and control bytes other than newline
  /// and tab become U+FFFD, so a half-trained model's samples cannot garble the console.
  [[nodiscard]] static std::string printable(std::string_view bytes);
};

}  // namespace ght::trainer
