// `ght prep`: text files -> byte-level token shards (train_NNNNNN.bin, val_NNNNNN.bin), or
// already-tokenized uint16/uint32/int32 arrays (raw or .npy) wrapped into the same shards.
// The shard format is described in trainer/data.hpp and data/README.md.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "tier/error.hpp"
#include "trainer/cli/command.hpp"
#include "trainer/data.hpp"
#include "trainer/metrics_log.hpp"
#include "trainer/tokenizer.hpp"

namespace {

using namespace ght::trainer;

struct PrepArgs {
  std::vector<std::string> inputs;
  std::vector<std::string> from_tokens;
  std::string out;
  std::string dtype;
  double val_fraction = 0.1;
  std::int64_t shard_tokens = 100'000'000;
  std::int64_t vocab = 0;
  bool overwrite = false;
  bool quiet = false;
};

bool is_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  char m[6] = {};
  f.read(m, sizeof m);
  return f.gcount() == 6 && std::memcmp(m, "\x93NUMPY", 6) == 0;
}

std::string with_commas(std::int64_t v) {
  // Built forwards (not with insert(), which trips GCC 12's -Wrestrict false positive).
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string s = v < 0 ? "-" : "";
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

void run_prep(const PrepArgs& a) {
  if (a.inputs.empty() == a.from_tokens.empty()) {
    throw ght::logic_error("ght prep: give either --input (text) or --from-tokens (token arrays)");
  }
  PrepOptions opt;
  opt.out_dir = a.out;
  opt.val_fraction = a.val_fraction;
  opt.shard_tokens = a.shard_tokens;
  opt.overwrite = a.overwrite;
  opt.vocab = a.vocab;

  std::optional<TokenDtype> dtype;
  if (!a.dtype.empty()) {
    dtype = parse_token_dtype(a.dtype);
    if (!dtype) throw ght::logic_error("ght prep: --dtype must be uint16 or uint32, got '" + a.dtype + "'");
  }

  // Progress on stderr for inputs big enough to take a while (a terminal sees it sooner).
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  std::unique_ptr<ProgressBar> bar;
  if (!a.quiet) {
    opt.progress = [&bar, tty](std::int64_t done, std::int64_t total) {
      if (!bar) {
        if (total < (tty ? (8LL << 20) : (256LL << 20))) return;
        bar = std::make_unique<ProgressBar>("prep", total, /*bytes=*/true, stderr);
      }
      bar->update(done);
    };
  }

  PrepResult r;
  if (!a.inputs.empty()) {
    if (a.vocab > 0 && a.vocab < ByteTokenizer::kVocab) {
      throw ght::logic_error("ght prep: text input is byte-tokenized (vocab 256); --vocab " +
                             std::to_string(a.vocab) + " is too small");
    }
    opt.dtype = dtype.value_or(TokenDtype::u16);
    opt.vocab = ByteTokenizer::kVocab;
    r = prep_text(a.inputs, opt);
  } else {
    bool all_u16_npy = true;
    for (const auto& f : a.from_tokens) {
      if (!std::filesystem::is_regular_file(f)) throw ght::io_error(f + ": no such token file");
      if (is_npy(f)) {
        all_u16_npy = all_u16_npy && read_npy_info(f).dtype == ArrayDtype::u16;
      } else if (!dtype) {
        throw ght::logic_error("ght prep: " + f +
                               " is a raw token array; say its element type with --dtype uint16|uint32");
      } else {
        all_u16_npy = all_u16_npy && *dtype == TokenDtype::u16;
      }
    }
    opt.dtype = dtype.value_or(all_u16_npy ? TokenDtype::u16 : TokenDtype::u32);
    const ArrayDtype raw = dtype.value_or(TokenDtype::u16) == TokenDtype::u16 ? ArrayDtype::u16 : ArrayDtype::u32;
    r = prep_tokens(a.from_tokens, raw, opt);
  }
  if (bar) bar->finish();

  auto sum = [](const std::vector<ShardInfo>& v) {
    std::int64_t n = 0;
    for (const auto& s : v) n += s.tokens;
    return n;
  };
  std::printf("prep: %s%s tokens (%s) -> %zu train shard(s) with %s tokens, %zu val shard(s) with %s tokens\n",
              r.documents > 0 ? (std::to_string(r.documents) + " documents, ").c_str() : "",
              with_commas(r.tokens).c_str(), std::string(to_string(opt.dtype)).c_str(), r.train.size(),
              with_commas(sum(r.train)).c_str(), r.val.size(), with_commas(sum(r.val)).c_str());
  for (const auto& s : r.train) std::printf("  %s  %s tokens\n", s.path.c_str(), with_commas(s.tokens).c_str());
  for (const auto& s : r.val) std::printf("  %s  %s tokens\n", s.path.c_str(), with_commas(s.tokens).c_str());
  std::printf("  %s\n", (std::filesystem::path(a.out) / "prep.json").string().c_str());
}

void setup(CLI::App& app) {
  auto a = std::make_shared<PrepArgs>();
  auto* c = app.add_subcommand(
      "prep", "Make llm.c token shards: text files via the byte tokenizer, or wrap token arrays");
  c->add_option("--input", a->inputs,
                "Text files, or directories whose *.txt files are read (recursively, sorted); each "
                "file is one document, preceded by the EOT token (byte 0)")
      ->type_name("FILE_OR_DIR");
  c->add_option("--from-tokens", a->from_tokens,
                "Already-tokenized arrays: .npy (dtype <u2, <u4 or <i4, 1-D) or raw little-endian "
                "files of --dtype")
      ->type_name("FILE");
  c->add_option("--out", a->out, "Output directory for train_*.bin, val_*.bin and prep.json")
      ->required()
      ->type_name("DIR");
  c->add_option("--dtype", a->dtype,
                "Shard token width, and the element type of raw --from-tokens files: uint16 | "
                "uint32 (default: uint16 for text and <u2 arrays, else uint32)");
  c->add_option("--val-fraction", a->val_fraction,
                "Share of all tokens, taken from the end, written as val shards (0 = none)")
      ->capture_default_str();
  c->add_option("--shard-tokens", a->shard_tokens, "Tokens per shard (at most 2147483647)")
      ->capture_default_str();
  c->add_option("--vocab", a->vocab, "--from-tokens: reject token ids >= N (0 = no check)");
  c->add_flag("--overwrite", a->overwrite, "Replace existing train_*/val_* shards in --out");
  c->add_flag("--quiet", a->quiet, "No progress output");
  c->callback([a] { run_prep(*a); });
}

}  // namespace

GHT_REGISTER_COMMAND(prep, setup);
