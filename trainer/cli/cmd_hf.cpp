// ght export / import / logits: Hugging Face interop and a logits dump for parity checks.
#include <filesystem>
#include <fstream>
#include <iostream>

#include "tier/error.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/cli/command.hpp"
#include "trainer/model_io.hpp"

namespace {

namespace tr = ght::trainer;

void setup_export(CLI::App& app) {
  struct A { std::string hf, ckpt, init; std::uint64_t seed = 1; };
  auto a = std::make_shared<A>();
  auto* c = app.add_subcommand("export", "Write a model as a Hugging Face Qwen3MoeForCausalLM directory");
  c->add_option("--hf", a->hf, "Output directory (config.json + model.safetensors)")->required();
  auto* ck = c->add_option("--ckpt", a->ckpt, "Checkpoint or run directory to export");
  auto* in = c->add_option("--init", a->init, "Export a freshly initialised preset instead (tiny, small, ...)");
  c->add_option("--seed", a->seed, "Init seed for --init")->capture_default_str();
  ck->excludes(in);
  c->callback([a] {
    GHT_EXPECTS(!a->ckpt.empty() || !a->init.empty(), "export: give --ckpt DIR or --init PRESET");
    if (!a->init.empty()) {
      tr::MoEModel<float> m(tr::preset(a->init));
      m.init(a->seed);
      tr::export_hf(m, a->hf);
    } else {
      tr::export_hf(tr::load_model_from_checkpoint(a->ckpt), a->hf);
    }
    std::cout << "exported to " << a->hf << "\n";
  });
}

void setup_import(CLI::App& app) {
  struct A { std::string hf, out; std::uint64_t seed = 1337; };
  auto a = std::make_shared<A>();
  auto* c = app.add_subcommand("import", "Load a Hugging Face Qwen3-MoE directory into a run directory (step-0 checkpoint)");
  c->add_option("--hf", a->hf, "Hugging Face directory (config.json + safetensors)")->required();
  c->add_option("--out", a->out, "Run directory to create the checkpoint in")->required();
  c->callback([a] {
    tr::MoEModel<float> m = tr::import_hf(a->hf);
    tr::TrainConfig cfg;
    cfg.model = m.config();
    cfg.out = a->out;
    cfg.schedule.total_steps = cfg.steps;
    tr::CheckpointData ck;
    ck.step = 0;
    const auto params = m.params();
    for (const auto& t : m.tensors()) {
      const tr::FloatBuffer w(params.begin() + t.offset, params.begin() + t.offset + t.numel);
      ck.weights.push_back({t.name, t.shape, w});
      ck.master.push_back({t.name, t.shape, w});
      ck.adam_m.push_back({t.name, t.shape, tr::FloatBuffer(t.numel, 0.0f)});
      ck.adam_v.push_back({t.name, t.shape, tr::FloatBuffer(t.numel, 0.0f)});
    }
    ck.optimizer = {{"step", 0}, {"steps_skipped_nonfinite", 0}};
    ck.data_position = nlohmann::json::object();
    ck.config = cfg.to_json();
    const std::string dir = tr::save(a->out, 0, ck);
    std::cout << "imported " << a->hf << " into " << dir
              << " (continue with: ght train --resume " << dir << " ...)\n";
  });
}

void setup_logits(CLI::App& app) {
  struct A { std::string hf, ckpt, tokens, out; int batch = 1; };
  auto a = std::make_shared<A>();
  auto* c = app.add_subcommand("logits", "Dump fp32 CPU-backend logits for int32 tokens (parity checks)");
  auto* h = c->add_option("--hf", a->hf, "Hugging Face directory");
  auto* k = c->add_option("--ckpt", a->ckpt, "Checkpoint or run directory");
  h->excludes(k);
  c->add_option("--tokens", a->tokens, "Raw int32 tokens, (batch, T) row-major")->required();
  c->add_option("--batch", a->batch, "Rows in --tokens")->capture_default_str();
  c->add_option("--out", a->out, "Output: raw fp32 logits (batch, T, vocab)")->required();
  c->callback([a] {
    GHT_EXPECTS(!a->hf.empty() || !a->ckpt.empty(), "logits: give --hf DIR or --ckpt DIR");
    tr::MoEModel<float> m = a->hf.empty() ? tr::load_model_from_checkpoint(a->ckpt) : tr::import_hf(a->hf);
    std::ifstream in(a->tokens, std::ios::binary | std::ios::ate);
    if (!in) throw ght::io_error("cannot open " + a->tokens);
    const auto bytes = static_cast<std::size_t>(in.tellg());
    GHT_EXPECTS(a->batch > 0 && bytes % (4 * static_cast<std::size_t>(a->batch)) == 0 && bytes > 0,
                a->tokens + ": size " + std::to_string(bytes) + " is not batch x T int32 values");
    std::vector<std::int32_t> tok(bytes / 4);
    in.seekg(0);
    in.read(reinterpret_cast<char*>(tok.data()), static_cast<std::streamsize>(bytes));
    const int T = static_cast<int>(tok.size() / a->batch);
    std::vector<float> logits(static_cast<std::size_t>(a->batch) * T * m.config().vocab);
    m.logits(logits.data(), tok.data(), a->batch, T, /*last_only=*/false);
    std::ofstream o(a->out, std::ios::binary);
    o.write(reinterpret_cast<const char*>(logits.data()),
            static_cast<std::streamsize>(logits.size() * sizeof(float)));
    if (!o) throw ght::io_error("cannot write " + a->out);
    std::cout << "wrote " << a->out << " (" << a->batch << " x " << T << " x " << m.config().vocab << " fp32)\n";
  });
}

}  // namespace

GHT_REGISTER_COMMAND(export, setup_export);
GHT_REGISTER_COMMAND(import, setup_import);
GHT_REGISTER_COMMAND(logits, setup_logits);
