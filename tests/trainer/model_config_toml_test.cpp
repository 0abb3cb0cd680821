// The TOML model loader: keys equal to ModelConfig's members, presets as a base, strict errors
// naming the file and the key.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "tier/error.hpp"
#include <unistd.h>

#include "trainer/model_config_toml.hpp"

namespace ght::trainer {
namespace {

class TomlFile {
 public:
  explicit TomlFile(const std::string& text) {
    path_ = (std::filesystem::temp_directory_path() /
             // The pid keeps parallel ctest processes (one per test) from sharing a file.
             ("ght_model_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++) + ".toml"))
                .string();
    std::ofstream(path_) << text;
  }
  ~TomlFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

std::string error_of(const std::string& text) {
  TomlFile f(text);
  try {
    (void)load_model_config(f.path());
  } catch (const io_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(f.path()), std::string::npos) << msg;
    return msg;
  }
  return "";
}

TEST(ModelConfigToml, FieldsAndPresetBase) {
  TomlFile f(
      "name = \"mine\"\nd_model = 128\nlayers = 3\nheads = 4\nkv_heads = 2\nhead_dim = 32\n"
      "experts = 8\ntop_k = 2\nexpert_ffn = 96\nnorm_topk_prob = false\nrope_theta = 500000\n"
      "vocab = 300\ntied_embeddings = false\nrms_eps = 1e-5\naux_loss_coef = 0.02\n"
      "z_loss_coef = 0.0\nseq_len = 64\nmicro_batch = 2\ngrad_accum = 3\n");
  const ModelConfig c = load_model_config(f.path());
  EXPECT_EQ(c.name, "mine");
  EXPECT_EQ(c.d_model, 128);
  EXPECT_EQ(c.layers, 3);
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.experts, 8);
  EXPECT_EQ(c.expert_ffn, 96);
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);  // an integer is accepted for a float
  EXPECT_EQ(c.vocab, 300);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_DOUBLE_EQ(c.rms_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.aux_loss_coef, 0.02);
  EXPECT_EQ(c.grad_accum, 3);

  TomlFile g("[model]\npreset = \"seed-21b\"\ngrad_accum = 2\n");
  const ModelConfig s = load_model_config(g.path());
  const ModelConfig seed = preset("seed-21b");
  EXPECT_EQ(s.grad_accum, 2);
  EXPECT_EQ(s.layers, seed.layers);
  EXPECT_EQ(s.total_params(), seed.total_params());
}

TEST(ModelConfigToml, ErrorsNameFileAndKey) {
  EXPECT_NE(error_of("layers = \"three\"\n").find("key 'layers': expected an integer"), std::string::npos);
  EXPECT_NE(error_of("layers = 3.0\n").find("key 'layers': expected an integer"), std::string::npos);
  EXPECT_NE(error_of("rope_theta = true\n").find("key 'rope_theta': expected a number"), std::string::npos);
  EXPECT_NE(error_of("layer = 3\n").find("unknown key 'layer'"), std::string::npos);
  EXPECT_NE(error_of("[model]\nlayres = 3\n").find("unknown key 'model.layres'"), std::string::npos);
  EXPECT_NE(error_of("preset = \"seed-22b\"\n").find("key 'preset': unknown model preset 'seed-22b'"),
            std::string::npos);
  EXPECT_NE(error_of("heads = 5\nkv_heads = 2\n").find("multiple of kv_heads"), std::string::npos);
  EXPECT_NE(error_of("layers = 99999999999\n").find("key 'layers'"), std::string::npos);
  EXPECT_NE(error_of("layers = [1\n").find("cannot parse"), std::string::npos);
  EXPECT_NE(error_of("layers = 2\n[model]\nlayers = 3\n").find("not both"), std::string::npos);
  EXPECT_THROW((void)load_model_config("/nonexistent/model.toml"), io_error);
}

}  // namespace
}  // namespace ght::trainer
