// The plan against the run's own measurements: the forward and backward the run measured after
// its warm-up step, written to <out>/measurements.json for the next start (GHT_PLAN_MEASUREMENTS,
// ght plan --measurements), and, with GHT_POLICY=auto, the search made again on them and logged
// beside the plan the run follows.
#include <limits>

#include "tier/regions_json.hpp"
#include "trainer/cuda/train_run.hpp"

namespace ght::trainer::cuda_run {

namespace fs = std::filesystem;

// The first step allocates, captures graphs and waits for nothing before it: its phases are not
// the run's.
void CudaRun::keep_phases(std::int64_t step, const StepProfile& p) {
  if (step <= first_step_ + 1 || p.traced) return;
  phase_fwd_s_.push_back(p.forward_ms / 1e3);
  phase_bwd_s_.push_back(p.backward_ms / 1e3);
}

tier::Measurements CudaRun::measurements() const {
  tier::Measurements m;
  m.step_tokens = static_cast<double>(cfg_.model.tokens_per_step());
  if (phase_fwd_s_.empty() || !plan_) return m;
  const tier::Prediction& p = plan_->prediction();
  m.phases.step_flops = plan_->options().step_flops;
  // The cost model's recompute seconds are its FLOPs at the sustained rate (cost_model.hpp).
  m.phases.recompute_flops = p.recompute_seconds * plan_->options().assumed_tflops * 1e12;
  m.phases.head_flops = plan_->options().head_flops;
  m.phases.forward_seconds = median(phase_fwd_s_);
  m.phases.backward_seconds = median(phase_bwd_s_);
  return m;
}

void CudaRun::write_measurements() const {
  if (!s_.leader()) return;
  const tier::Measurements m = measurements();
  if (!m.phases.present()) return;
  fs::create_directories(cfg_.out);
  fileio::atomic_write((fs::path(cfg_.out) / "measurements.json").string(), tier::measurements_to_json(m));
}

void CudaRun::replan_on_measurements(MetricsLogger& log) const {
  if (!plan_ || plan_->options().policy != tier::Policy::auto_replan) return;
  const tier::Measurements m = measurements();
  if (!m.phases.present()) return;
  std::string line = "auto: re-planned on the phases measured after the warm-up step (median of " +
                     std::to_string(phase_fwd_s_.size()) + " steps)";
  try {
    const tier::ComputeCalibration c = tier::calibrate_compute(m.phases, plan_->options().head_tflops);
    line += fmt(": the layers at %.0f TFLOP/s sustained", c.tflops) +
            fmt(", their backward %.2fx the forward", c.backward_ratio) +
            fmt(" (the LM head's %.2f s taken out of the backward)", plan_->options().head_seconds());
    const tier::SearchResult r = search_model_plans(cfg_.model, plan_base_, plan_scope_, &m);
    if (!r.chosen) {
      log.print(line + "; no plan fits on them (the run keeps its own)");
      return;
    }
    const tier::Candidate& best = r.best();
    double running = std::numeric_limits<double>::infinity();
    for (const tier::Candidate& cand : r.candidates) {
      if (cand.settings == plan_settings_) running = cand.step_seconds();
    }
    line += "; chosen " + best.changes(r.dimensions) + fmt(", predicted %.3f s/step", best.step_seconds());
    if (best.settings == plan_settings_) {
      line += ": the choice this run follows";
    } else {
      line += fmt("; this run's choice predicts %.3f s/step on them", running) +
              ". A run started with GHT_PLAN_MEASUREMENTS=" + (fs::path(cfg_.out) / "measurements.json").string() +
              " plans on these measurements";
    }
  } catch (const ght::logic_error& e) {  // config_error included: phases the model cannot explain
    line += "; not used: " + std::string(e.what());
  }
  log.print(line);
}

}  // namespace ght::trainer::cuda_run
