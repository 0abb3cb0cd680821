// ght sample: generate text from a checkpoint with the CPU backend.
#include <cmath>
#include <iostream>
#include <random>

#include "tier/config.hpp"
#include "tier/error.hpp"
#include "trainer/cli/command.hpp"
#include "trainer/model_io.hpp"
#include "trainer/tokenizer.hpp"

namespace {

namespace tr = ght::trainer;

void setup(CLI::App& app) {
  // --temperature and --seed are parsed by the config parsers: CLI11's Range lets nan through
  // and its unsigned conversion is not strict about overflow.
  struct A { std::string ckpt, prompt = "The "; int tokens = 200; std::string temperature_text = "0.8"; double temperature = 0.8; int top_k = 40; std::string seed_text = "1"; std::uint64_t seed = 1; };
  auto a = std::make_shared<A>();
  auto* c = app.add_subcommand("sample", "Generate text from a checkpoint (byte-level tokenizer)");
  c->add_option("--ckpt", a->ckpt, "Checkpoint or run directory")->required();
  c->add_option("--prompt", a->prompt, "Prompt text")->capture_default_str();
  c->add_option("-n,--tokens", a->tokens, "Tokens to generate")->capture_default_str()->check(CLI::Range(1, 1 << 20));
  c->add_option("--temperature", a->temperature_text, "Sampling temperature in [0, 10] (0 = greedy)")->capture_default_str();
  c->add_option("--top-k", a->top_k, "Sample among the k most likely tokens (0 = all)")->capture_default_str()->check(CLI::Range(0, 1 << 20));
  c->add_option("--seed", a->seed_text, "Sampling seed, in [0, 2^63-1]")->capture_default_str();
  c->callback([a] {
    a->temperature = ght::config::parse_float("--temperature", a->temperature_text, "0:10");
    a->seed = static_cast<std::uint64_t>(
        ght::config::parse_int("--seed", a->seed_text, "0:9223372036854775807"));
    tr::MoEModel<float> m = tr::load_model_from_checkpoint(a->ckpt);
    const int V = m.config().vocab, T = m.config().seq_len;
    GHT_EXPECTS(V == tr::ByteTokenizer::kVocab,
                "sample: the byte tokenizer needs vocab 256; this model has " + std::to_string(V));
    std::vector<std::int32_t> ctx;
    ctx.push_back(static_cast<std::int32_t>(tr::ByteTokenizer::kEot));  // documents start with EOT
    for (auto t : tr::ByteTokenizer::encode(a->prompt)) ctx.push_back(static_cast<std::int32_t>(t));
    std::mt19937_64 rng(a->seed);
    std::vector<float> logits(V);
    std::vector<std::int32_t> generated;
    for (int i = 0; i < a->tokens; ++i) {
      const int n = std::min<int>(static_cast<int>(ctx.size()), T);
      m.logits(logits.data(), ctx.data() + ctx.size() - n, 1, n, /*last_only=*/true);
      int next = 0;
      if (a->temperature == 0) {
        next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      } else {
        std::vector<int> idx(V);
        for (int v = 0; v < V; ++v) idx[v] = v;
        const int k = (a->top_k <= 0 || a->top_k > V) ? V : a->top_k;
        std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                          [&](int x, int y) { return logits[x] > logits[y]; });
        std::vector<double> p(k);
        for (int j = 0; j < k; ++j) p[j] = std::exp((logits[idx[j]] - logits[idx[0]]) / a->temperature);
        std::discrete_distribution<int> dist(p.begin(), p.end());
        next = idx[dist(rng)];
      }
      ctx.push_back(next);
      generated.push_back(next);
    }
    std::cout << a->prompt << tr::ByteTokenizer::printable(tr::ByteTokenizer::decode(generated, true)) << "\n";
  });
}

}  // namespace

GHT_REGISTER_COMMAND(sample, setup);
