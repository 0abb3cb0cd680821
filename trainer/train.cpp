#include "trainer/train.hpp"

#include <omp.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "optimizer/adamw.hpp"
#include "tier/error.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/data.hpp"
#include "trainer/metrics_log.hpp"
#include "trainer/model.hpp"
#include "trainer/signals.hpp"
#include "trainer/tokenizer.hpp"

#ifdef GHT_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "trainer/cuda/train_cuda.hpp"
#endif

namespace ght::trainer {

namespace fs = std::filesystem;

namespace {

bool gpu_present() {
#ifdef GHT_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
#else
  return false;
#endif
}

// One optimizer region per named tensor: the weight-decay mask is per tensor (none on norms).
std::vector<optimizer::Region> make_regions(MoEModel<float>& model) {
  std::vector<optimizer::Region> regions;
  auto grads = model.grads();
  for (const auto& t : model.tensors()) {
    optimizer::Region r;
    r.name = t.name;
    r.n = t.numel;
    r.weight_decay = t.decay;
    r.weight = nullptr;  // the CPU backend computes on the fp32 master copy itself
    r.grad = grads.data() + t.offset;
    r.grad_type = optimizer::GradType::fp32;
    regions.push_back(std::move(r));
  }
  return regions;
}

optimizer::AdamWOptions adam_options(const TrainConfig& cfg) {
  optimizer::AdamWOptions o;
  o.hyper = cfg.adam;
  o.path = optimizer::PathChoice::cpu;
  o.cpu_threads = cfg.threads;
  return o;
}

// master -> the model's fp32 parameters (the CPU backend computes on them directly).
void copy_master_to_params(const optimizer::AdamW& opt, MoEModel<float>& model) {
  auto params = model.params();
  const auto& ts = model.tensors();
  for (std::size_t r = 0; r < ts.size(); ++r) {
    opt.save_state(r, params.data() + ts[r].offset, nullptr, nullptr);
  }
}

CheckpointData snapshot(const TrainConfig& cfg, const MoEModel<float>& model,
                        const optimizer::AdamW& opt, const DataLoader& loader, std::int64_t step) {
  CheckpointData c;
  c.step = step;
  auto params = model.params();
  for (std::size_t r = 0; r < model.tensors().size(); ++r) {
    const auto& t = model.tensors()[r];
    CheckpointTensor w{t.name, t.shape, FloatBuffer(params.begin() + t.offset, params.begin() + t.offset + t.numel)};
    CheckpointTensor ms{t.name, t.shape, FloatBuffer(t.numel, 0.0f)};
    CheckpointTensor m{t.name, t.shape, FloatBuffer(t.numel, 0.0f)};
    CheckpointTensor v{t.name, t.shape, FloatBuffer(t.numel, 0.0f)};
    opt.save_state(r, ms.data.data(), m.data.data(), v.data.data());
    c.weights.push_back(std::move(w));
    c.master.push_back(std::move(ms));
    c.adam_m.push_back(std::move(m));
    c.adam_v.push_back(std::move(v));
  }
  c.optimizer = {{"step", opt.step_count()},
                 {"steps_skipped_nonfinite", opt.stats().steps_skipped_nonfinite}};
  c.data_position = loader.state().to_json();
  c.rng = {{"init_seed", cfg.seed}, {"note", "training draws no random numbers after init"}};
  c.config = cfg.to_json();
  return c;
}

void restore(const CheckpointData& c, MoEModel<float>& model, optimizer::AdamW& opt,
             DataLoader& loader, const std::string& where) {
  auto params = model.params();
  GHT_EXPECTS(c.master.size() == model.tensors().size(),
              "checkpoint " + where + " has " + std::to_string(c.master.size()) +
                  " optimizer tensors; the model has " + std::to_string(model.tensors().size()));
  for (std::size_t r = 0; r < model.tensors().size(); ++r) {
    const auto& t = model.tensors()[r];
    const auto& ms = c.master[r];
    GHT_EXPECTS(ms.name == t.name && ms.data.size() == t.numel && c.adam_m[r].data.size() == t.numel &&
                    c.adam_v[r].data.size() == t.numel,
                "checkpoint " + where + ": tensor " + ms.name + " does not match the model's " + t.name);
    opt.load_state(r, ms.data.data(), c.adam_m[r].data.data(), c.adam_v[r].data.data());
    std::copy(ms.data.begin(), ms.data.end(), params.begin() + t.offset);
  }
  opt.set_step_count(c.optimizer.at("step").get<std::int64_t>());
  loader.restore(LoaderState::from_json(c.data_position));
}

}  // namespace

template <class Model>
double evaluate(Model& model, const std::string& data, int batches, int B, int T) {
  const DataSplit split = resolve_split(data);
  GHT_EXPECTS(!split.val.empty(), "no val_* shards under " + data + " (run `ght prep` first)");
  LoaderOptions lo;
  lo.batch = B;
  lo.seq_len = T;
  lo.shuffle = false;
  lo.vocab = model.config().vocab;
  DataLoader val(split.val, lo);
  double sum = 0;
  Batch b;
  for (int i = 0; i < batches; ++i) {
    val.next(b);
    sum += model.forward(b.inputs.data(), b.targets.data(), B, T).ce;
  }
  return sum / batches;
}
template double evaluate<MoEModel<float>>(MoEModel<float>&, const std::string&, int, int, int);

TrainSummary train(const TrainConfig& cfg_in, const TrainRunOptions& run) {
  TrainConfig cfg = cfg_in;
  cfg.validate();
  TrainSummary summary;
  std::ostream& out = std::cout;
  auto say = [&](const std::string& s) {
    if (!run.quiet) out << s << std::endl;
  };

  if (cfg.backend == "cuda" || (cfg.backend == "auto" && gpu_present())) {
#ifdef GHT_HAVE_CUDA
    return train_cuda(cfg, run);
#else
    throw ght::logic_error("train.backend=cuda: this build has no CUDA (nvcc was not found at configure time)");
#endif
  }
  if (run.profile_steps > 0) {
    say("note: --profile-steps applies to the cuda backend; the cpu backend logs each step's time and "
        "tokens/s to log.jsonl only");
  }
  summary.backend = "cpu";
  if (cfg.threads > 0) omp_set_num_threads(cfg.threads);

  const ModelConfig& mc = cfg.model;
  const int B = mc.micro_batch, T = mc.seq_len;
  const DataSplit split = resolve_split(cfg.data);
  GHT_EXPECTS(!split.train.empty(), "no train_* shards under " + cfg.data + " (run `ght prep` first)");
  LoaderOptions lo;
  lo.batch = B;
  lo.seq_len = T;
  lo.seed = cfg.seed;
  lo.vocab = mc.vocab;
  DataLoader loader(split.train, lo);

  MoEModel<float> model(mc);
  model.init(cfg.seed);
  optimizer::AdamW opt(make_regions(model), adam_options(cfg));
  for (std::size_t r = 0; r < model.tensors().size(); ++r) {
    const auto& t = model.tensors()[r];
    opt.load_state(r, model.params().data() + t.offset, nullptr, nullptr);
  }

  fs::create_directories(cfg.out);
  std::int64_t step = 0;
  if (const auto ck = load_for_resume(run.resume, cfg.out, say)) {
    const CheckpointData& c = ck->data;
    // The architecture must match; training knobs may change on resume.
    const TrainConfig saved = TrainConfig::from_json(c.config);
    GHT_EXPECTS(saved.to_json()["model"] == cfg.to_json()["model"],
                "checkpoint " + ck->dir + " was written for a different model config");
    restore(c, model, opt, loader, ck->dir);
    step = c.step;
    say("resumed from " + ck->dir + " at step " + std::to_string(step));
  }
  summary.first_step = step;

  const std::int64_t tokens_per_step = mc.tokens_per_step();
  say("model " + mc.name + ": " + std::to_string(mc.total_params()) + " params (" +
      std::to_string(mc.active_params()) + " active), " + std::to_string(tokens_per_step) +
      " tokens/step, backend cpu, " + std::to_string(omp_get_max_threads()) + " threads");

  MetricsLogOptions lopt;
  lopt.jsonl_path = (fs::path(cfg.out) / "log.jsonl").string();
  lopt.total_steps = cfg.steps;
  lopt.quiet = run.quiet;
  lopt.console_every = cfg.log_every;
  MetricsLogger log(lopt);
  log.log_event({{"type", "config"}, {"step", step}, {"config", cfg.to_json()}});

  install_stop_handlers();
  const auto t_start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  };
  auto save_ckpt = [&](std::int64_t s) {
    summary.last_checkpoint = save(cfg.out, s, snapshot(cfg, model, opt, loader, s));
    prune(cfg.out, cfg.keep);
  };
  const std::int64_t last = run.stop_at ? std::min(*run.stop_at, cfg.steps) : cfg.steps;
  Batch b;
  while (step < last) {
    const auto t0 = std::chrono::steady_clock::now();
    model.zero_grad();
    double loss = 0, aux = 0;
    for (int micro = 0; micro < mc.grad_accum; ++micro) {
      loader.next(b);
      const Loss l = model.forward(b.inputs.data(), b.targets.data(), B, T);
      model.backward(1.0f / static_cast<float>(mc.grad_accum));
      loss += l.ce / mc.grad_accum;
      aux += l.aux / mc.grad_accum;
    }
    const double lr = lr_at(cfg.schedule, step);
    const optimizer::StepResult sr = opt.step(lr);
    copy_master_to_params(opt, model);
    ++step;
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    StepRecord rec;
    rec.step = step;
    rec.loss = loss;
    rec.aux_loss = aux;
    rec.grad_norm = sr.grad_norm;
    rec.lr = lr;
    rec.tokens_per_s = static_cast<double>(tokens_per_step) / dt;
    rec.elapsed_s = elapsed();
    rec.skipped_steps = opt.stats().steps_skipped_nonfinite;
    log.log_step(rec);
    summary.last_loss = loss;

    if ((cfg.eval_every > 0 && step % cfg.eval_every == 0) || step == cfg.steps) {
      if (!split.val.empty()) {
        summary.eval_loss = evaluate(model, cfg.data, cfg.eval_batches, B, T);
        log.log_eval(step, *summary.eval_loss, elapsed());
      }
    }
    if (stop_requested()) {
      log.print("signal " + std::to_string(stop_signal()) + " received: checkpointing at step " +
                std::to_string(step) + " and exiting");
      save_ckpt(step);
      summary.stopped_by_signal = true;
      break;
    }
    if ((cfg.ckpt_every > 0 && step % cfg.ckpt_every == 0) || step == last) save_ckpt(step);
  }
  log.finish();
  uninstall_stop_handlers();
  summary.last_step = step;
  if (!summary.last_checkpoint.empty()) say("checkpoint: " + summary.last_checkpoint);
  return summary;
}

}  // namespace ght::trainer
