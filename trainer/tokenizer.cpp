#include "trainer/tokenizer.hpp"

#include "tier/error.hpp"

namespace ght::trainer {

namespace {
template <class T>
std::string decode_impl(std::span<const T> tokens, bool skip_eot) {
  std::string out;
  out.reserve(tokens.size());
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto t = static_cast<std::int64_t>(tokens[i]);
    GHT_EXPECTS(t >= 0 && t < ByteTokenizer::kVocab,
                "byte tokenizer: token " + std::to_string(t) + " at index " + std::to_string(i) +
                    " is outside the vocabulary 0..255");
    if (skip_eot && t == ByteTokenizer::kEot) continue;
    out.push_back(static_cast<char>(static_cast<unsigned char>(t)));
  }
  return out;
}

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is invalid there.
std::size_t utf8_len(std::string_view s, std::size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  std::size_t n = 0;
  std::uint32_t cp = 0;
  if (b0 < 0x80) return 1;
  if ((b0 & 0xE0) == 0xC0) { n = 2; cp = b0 & 0x1F; }
  else if ((b0 & 0xF0) == 0xE0) { n = 3; cp = b0 & 0x0F; }
  else if ((b0 & 0xF8) == 0xF0) { n = 4; cp = b0 & 0x07; }
  else return 0;
  if (i + n > s.size()) return 0;
  for (std::size_t k = 1; k < n; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  // Reject overlong forms, surrogates and values past U+10FFFF.
  static constexpr std::uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}
}  // namespace

std::vector<std::uint32_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<std::uint32_t> out(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string ByteTokenizer::decode(std::span<const std::uint32_t> tokens, bool skip_eot) {
  return decode_impl(tokens, skip_eot);
}

std::string ByteTokenizer::decode(std::span<const std::int32_t> tokens, bool skip_eot) {
  return decode_impl(tokens, skip_eot);
}

std::string ByteTokenizer::printable(std::string_view bytes) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(bytes.size());
  for (std::size_t i = 0; i < bytes.size();) {
    const std::size_t n = utf8_len(bytes, i);
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (n == 0 || (n == 1 && ((b < 0x20 && b != '\n' && b != '\t') || b == 0x7F))) {
      out += kReplacement;
      i += 1;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
    }
  }
  return out;
}

}  // namespace ght::trainer
