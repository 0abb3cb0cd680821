#include "trainer/model_io.hpp"

#include <filesystem>

#include "tier/error.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/hf_config.hpp"
#include "trainer/safetensors.hpp"

namespace ght::trainer {

namespace fs = std::filesystem;

MoEModel<float> load_model_from_checkpoint(const std::string& ckpt_or_run, TrainConfig* cfg_out) {
  // The weights only: master, m and v (12 of every 16 bytes) are neither read nor checksummed.
  LoadOptions weights_only;
  weights_only.optimizer_state = false;
  std::optional<LoadedCheckpoint> ck;
  if (fs::exists(fs::path(ckpt_or_run) / "COMMITTED")) {
    ck = LoadedCheckpoint{ckpt_or_run, load(ckpt_or_run, weights_only)};
  } else {
    ck = load_latest(ckpt_or_run, weights_only);
  }
  if (!ck) throw ght::io_error("no committed checkpoint at or under " + ckpt_or_run);
  const std::string& dir = ck->dir;
  const CheckpointData& c = ck->data;
  const TrainConfig cfg = TrainConfig::from_json(c.config);
  MoEModel<float> model(cfg.model);
  auto params = model.params();
  for (const auto& w : c.weights) {
    const NamedTensor& t = model.tensor(w.name);
    if (w.data.size() != t.numel) {
      throw ght::io_error("checkpoint " + dir + ": tensor " + w.name + " has " +
                          std::to_string(w.data.size()) + " elements, expected " +
                          std::to_string(t.numel));
    }
    std::copy(w.data.begin(), w.data.end(), params.begin() + t.offset);
  }
  GHT_EXPECTS(c.weights.size() == model.tensors().size(),
              "checkpoint " + dir + " holds " + std::to_string(c.weights.size()) +
                  " weight tensors; the model has " + std::to_string(model.tensors().size()));
  if (cfg_out != nullptr) *cfg_out = cfg;
  return model;
}

void export_hf(const MoEModel<float>& model, const std::string& dir) {
  fs::create_directories(dir);
  write_hf_config(dir, model.config());
  std::vector<TensorRef> refs;
  const auto params = model.params();
  for (const auto& t : model.tensors()) {
    refs.push_back(TensorRef{t.name, StDtype::F32, t.shape, params.data() + t.offset});
  }
  write_safetensors_sharded(dir, refs);
}

MoEModel<float> import_hf(const std::string& dir) {
  const ModelConfig mc = read_hf_config((fs::path(dir) / "config.json").string());
  MoEModel<float> model(mc);
  SafetensorsDir st(dir);
  auto params = model.params();
  for (const auto& t : model.tensors()) {
    if (!st.contains(t.name)) throw ght::io_error(dir + ": missing tensor " + t.name);
    const TensorInfo& info = st.info(t.name);
    if (info.shape != t.shape) {
      throw ght::io_error(dir + ": tensor " + t.name + " has the wrong shape");
    }
    const std::vector<float> data = st.read_f32(t.name);
    std::copy(data.begin(), data.end(), params.begin() + t.offset);
  }
  for (const auto& name : st.names()) {
    (void)model.tensor(name);  // throws naming an unexpected tensor (e.g. an untied lm_head)
  }
  return model;
}

}  // namespace ght::trainer
