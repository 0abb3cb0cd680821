// `ght cuda-check` (hidden): one CUDA-backend forward + backward of a Hugging Face model on given
// tokens, for tests/interop/check_hf_gpu.py. Prints the losses as JSON and writes the chosen
// gradients as raw little-endian fp32 files. Compiled only with CUDA.
#ifdef GHT_HAVE_CUDA
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tier/error.hpp"
#include "trainer/cli/command.hpp"
#include "trainer/cuda/model_cuda.hpp"
#include "trainer/model_io.hpp"

namespace {

namespace tr = ght::trainer;
namespace fs = std::filesystem;

struct CheckArgs {
  std::string hf, tokens, out, grads = "model.embed_tokens.weight,model.layers.0.self_attn.q_proj.weight,"
                                      "model.layers.0.mlp.gate.weight,model.layers.0.mlp.experts.0.down_proj.weight,"
                                      "model.norm.weight";
  int batch = 1;
  double aux_coef = -1, z_coef = -1;
  std::string grad_type = "fp32";
  bool cpu = false;
};

std::vector<std::int32_t> read_tokens(const std::string& path, int batch, int* T) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw ght::io_error("cannot open " + path);
  const auto bytes = static_cast<std::size_t>(in.tellg());
  GHT_EXPECTS(batch > 0 && bytes > 0 && bytes % (4 * static_cast<std::size_t>(batch)) == 0,
              path + ": size " + std::to_string(bytes) + " is not batch x T int32 values");
  std::vector<std::int32_t> tok(bytes / 4);
  in.seekg(0);
  in.read(reinterpret_cast<char*>(tok.data()), static_cast<std::streamsize>(bytes));
  *T = static_cast<int>(tok.size() / static_cast<std::size_t>(batch));
  return tok;
}

nlohmann::ordered_json loss_json(const tr::Loss& l) {
  return {{"ce", l.ce}, {"aux", l.aux}, {"z", l.z}, {"total", l.total}, {"tokens", l.tokens}};
}

void run(const CheckArgs& a) {
  tr::MoEModel<float> cpu = tr::import_hf(a.hf);
  tr::ModelConfig cfg = cpu.config();
  if (a.aux_coef >= 0) cfg.aux_loss_coef = a.aux_coef;
  if (a.z_coef >= 0) cfg.z_loss_coef = a.z_coef;
  int T = 0;
  const auto tokens = read_tokens(a.tokens, a.batch, &T);
  // Hugging Face's labels=input_ids: position t predicts token t+1; the last one predicts nothing.
  std::vector<std::int32_t> targets(tokens.size());
  for (int b = 0; b < a.batch; ++b) {
    for (int t = 0; t < T; ++t) {
      const std::size_t i = static_cast<std::size_t>(b) * T + t;
      targets[i] = t + 1 < T ? tokens[i + 1] : tr::kIgnoreIndex;
    }
  }
  tr::CudaModelOptions mo;
  GHT_EXPECTS(a.grad_type == "fp32" || a.grad_type == "bf16", "--grad-type must be fp32 or bf16");
  mo.grad_type = a.grad_type == "fp32" ? ght::optimizer::GradType::fp32 : ght::optimizer::GradType::bf16;
  tr::CudaMoEModel gpu(cfg, mo);
  gpu.load_weights(cpu.params());
  gpu.zero_grad();
  const tr::Loss l = gpu.forward_backward(tokens.data(), targets.data(), a.batch, T, 1.0f);
  std::vector<float> g(gpu.num_params());
  gpu.store_grads(g);

  fs::create_directories(a.out);
  nlohmann::ordered_json j;
  j["config"] = {{"layers", cfg.layers}, {"experts", cfg.experts}, {"top_k", cfg.top_k},
                 {"aux_loss_coef", cfg.aux_loss_coef}, {"z_loss_coef", cfg.z_loss_coef}};
  j["batch"] = a.batch;
  j["seq"] = T;
  j["loss"] = loss_json(l);
  nlohmann::ordered_json files = nlohmann::ordered_json::object();
  std::stringstream names(a.grads);
  std::string name;
  while (std::getline(names, name, ',')) {
    if (name.empty()) continue;
    const tr::NamedTensor& t = gpu.tensor(name);
    const std::string file = (fs::path(a.out) / (name + ".f32")).string();
    std::ofstream o(file, std::ios::binary);
    o.write(reinterpret_cast<const char*>(g.data() + t.offset), static_cast<std::streamsize>(t.numel * 4));
    if (!o) throw ght::io_error("cannot write " + file);
    files[name] = {{"file", file}, {"shape", t.shape}};
  }
  j["grads"] = files;
  if (a.cpu) {
    // The fp32 CPU backend on the same weights and tokens, for reference.
    tr::MoEModel<float> ref(cfg);
    std::copy(cpu.params().begin(), cpu.params().end(), ref.params().begin());
    j["cpu_loss"] = loss_json(ref.forward(tokens.data(), targets.data(), a.batch, T));
  }
  const std::string out = (fs::path(a.out) / "result.json").string();
  std::ofstream o(out);
  o << j.dump(2) << "\n";
  if (!o) throw ght::io_error("cannot write " + out);
  std::cout << j.dump() << "\n";
}

void setup(CLI::App& app) {
  auto a = std::make_shared<CheckArgs>();
  auto* c = app.add_subcommand("cuda-check", "CUDA-backend loss and gradients of a HF model (parity checks)");
  c->group("");  // hidden: a test aid, not a user command
  c->add_option("--hf", a->hf, "Hugging Face directory (config.json + safetensors)")->required();
  c->add_option("--tokens", a->tokens, "Raw int32 tokens, (batch, T) row-major; targets are the next tokens")
      ->required();
  c->add_option("--batch", a->batch, "Rows in --tokens")->capture_default_str();
  c->add_option("--out", a->out, "Output directory: result.json and one <tensor>.f32 per gradient")->required();
  c->add_option("--grads", a->grads, "Comma-separated tensor names whose gradients are written")
      ->capture_default_str();
  c->add_option("--aux-coef", a->aux_coef, "Override aux_loss_coef (e.g. 0 to compare with HF's CE-only loss)");
  c->add_option("--z-coef", a->z_coef, "Override z_loss_coef");
  c->add_option("--grad-type", a->grad_type, "fp32 | bf16")->capture_default_str();
  c->add_flag("--cpu", a->cpu, "Also report the fp32 CPU backend's loss");
  c->callback([a] { run(*a); });
}

}  // namespace

GHT_REGISTER_COMMAND(cuda_check, setup);
#endif  // GHT_HAVE_CUDA
