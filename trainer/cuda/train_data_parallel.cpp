// The CUDA run's data parallelism over NCCL (world size > 1): the device per rank, the
// communicator, ZeRO-1's shards, the gradients' reduction (whole or per unit), the weights'
// gathers, their timing and the step's means over ranks.
#include "trainer/cuda/train_run.hpp"

namespace ght::trainer::cuda_run {

namespace fs = std::filesystem;

// ---- data parallel over NCCL (world size > 1) ---------------------------------------------------

// This rank's GPU: GHT_DEVICE when set, else its local rank (dist::choose_gpu checks it against
// the visible devices). The topology, and with it the allocator's HBM, follows GHT_DEVICE, so a
// device that came from the local rank is set there too.
int CudaRun::select_device(int visible) {
  config::Registry& reg = config::cfg();
  std::optional<int> explicit_device;
  if (reg.source(config::Key::GHT_DEVICE) != config::Source::Default) {
    explicit_device = static_cast<int>(reg.get_int(config::Key::GHT_DEVICE));
  }
  const dist::Env env = dist::process_env();
  gpu_choice_ = dist::choose_gpu(dist::detect_launch(env), explicit_device, visible, env);
  if (gpu_choice_.device != reg.get_int(config::Key::GHT_DEVICE)) {
    reg.set_flag("GHT_DEVICE", std::to_string(gpu_choice_.device));
    (void)tier::topology(true);
  }
  return gpu_choice_.device;
}

// The NCCL communicator over the run's processes (none for one process). Its buffers take
// HBM: the topology is read again so that the allocator's budget (free HBM) leaves them out.
void CudaRun::start_data_parallel() {
  if (s_.comm->size() == 1) return;
  gpu_comm_ = dist::make_gpu_communicator(*s_.comm, gpu_choice_);
  (void)tier::topology(true);
  const ModelConfig& mc = cfg_.model;
  if (cfg_.diloco.on()) {
    say("DiLoCo over " + std::to_string(s_.comm->size()) + " processes, one GPU each (" + gpu_comm_->name() +
        " only checks the GPUs): each reads " + std::to_string(mc.grad_accum) + " of every " +
        std::to_string(s_.comm->size() * mc.grad_accum) + " micro-batches and steps its own AdamW on them; the "
        "outer all-reduce of the pseudo-gradients runs over " + s_.comm->name() + " in host memory");
    return;
  }
  say("data parallel over " + std::to_string(s_.comm->size()) + " processes (" + gpu_comm_->name() +
      ", set up over " + s_.comm->name() + "; rank 0 on GPU " + std::to_string(gpu_choice_.device) + " by " +
      gpu_choice_.chosen_by + "): each reads " + std::to_string(mc.grad_accum) + " of every " +
      std::to_string(s_.comm->size() * mc.grad_accum) + " micro-batches; " +
      (cfg_.dist.sharded()
           ? "AdamW state sharded (ZeRO-1): each unit's gradients reduce-scattered as its last backward ends, "
             "each rank updates its 1/" + std::to_string(s_.comm->size()) + " of master, m and v, the bf16 weights "
             "all-gathered unit by unit before the next forward uses them"
           : std::string("gradients averaged over the ranks on the GPU after the last backward; AdamW state "
                         "replicated on every rank (dist.optimizer_state=replicated)")));
}

// ZeRO-1 with world size > 1 (trainer/zero.hpp): buckets are the model's units, so that a unit's
// gradients can be reduced as soon as its last backward ends and its weights gathered before its
// forward; each rank's optimizer regions are its slices of them. Otherwise every tensor whole.
void CudaRun::start_sharding() {
  const auto& ts = model_->tensors();
  if (!zero1()) {  // one process, replicated state, or DiLoCo (each worker's whole state)
    slices_ = whole_tensors(ts);
    return;
  }
  if (delay_) throw ght::config_error(delay_with_shards_message(s_.comm->size()));
  std::vector<dist::Range> units;
  for (const auto& [a, e] : unit_range_) units.push_back({a, e});
  shards_ = std::make_unique<StateShards>(ts, units, s_.comm->size(), s_.comm->rank());
  slices_ = shards_->slices();
  GHT_CUDA_TRY(cudaStreamCreateWithFlags(&comm_stream_, cudaStreamNonBlocking));
  zev_ = std::make_unique<ZeroEvents>(unit_range_.size());
  say("ZeRO-1: this rank holds master, m and v of " + std::to_string(shards_->owned()) + " of " +
      std::to_string(model_->num_params()) + " parameters, in " + std::to_string(slices_.size()) + " slices");
}

void CudaRun::check_data_parallel(const std::string& grad_mode) const {
  if (!data_parallel() || !stream_grads_ || cfg_.diloco.on()) return;  // DiLoCo reduces no gradients
  throw ght::config_error(
      "the plan streams gradients to the host (gradient mode " + grad_mode + ") in a data-parallel run of " +
      std::to_string(s_.comm->size()) + " processes: host-accumulated gradients are not all-reduced yet; keep "
      "them in HBM (a larger GHT_HBM_BUDGET, GHT_PLACE rules with grad=hbm under GHT_POLICY=static, or a smaller "
      "model or micro-batch), or launch one process");
}

// After the last backward, before the norm: the HBM gradients (each the mean over this rank's A
// micro-batches) become the mean over all ranks, the same bits on every rank, so the replicated
// optimizer state stays identical. The wait bounds it by GHT_DIST_TIMEOUT: a rank that never
// joins fails here, naming the collective, instead of hanging in begin_step's synchronisation.
void CudaRun::reduce_gradients() {
  if (!data_parallel() || cfg_.diloco.on()) return;  // DiLoCo: each worker steps on its own gradients
  const cudaStream_t s = model_->stream();
  if (shards_) {
    // ZeRO-1: every unit's reduction was queued as its last backward ended (reduce_unit); the
    // norm and the update read the gradients after them.
    zev_->reduce_end.record(comm_stream_);
    GHT_CUDA_TRY(cudaStreamWaitEvent(s, zev_->reduce_end.get(), 0));
    gpu_comm_->wait(comm_stream_);
    // The previous step's gathers came before this step's reductions on the comm stream.
    if (gathers_queued_) {
      double ms = 0;
      for (std::size_t b = 0; b < unit_range_.size(); ++b) ms += elapsed_ms(zev_->gather_begin[b], zev_->gathered[b]);
      prev_gather_ms_ = ms;
    }
    return;
  }
  const dist::GpuType t = grad_gpu_type();
  gpu_comm_->allreduce(model_->grads(), model_->num_params(), t, dist::GpuReduce::avg, s);
  gpu_comm_->wait(s);
}

// ZeRO-1, after unit u's last backward was queued: on the comm stream, once that backward is done,
// the unit's gradients (each the mean over this rank's micro-batches) become on this rank's piece
// the mean over the ranks: an in-place reduce-scatter of the unit's even part, and an all-reduce
// of the remainder (the last rank's, fewer than ranks x kShardAlign elements). Units end in
// backward order, the same on every rank, so the collectives match.
void CudaRun::reduce_unit(int u) {
  const auto b = static_cast<std::size_t>(u);
  const dist::ShardLayout& l = shards_->layout();
  const std::size_t a = l.buckets()[b].begin, n = l.buckets()[b].size(), q = l.even(b);
  const auto ranks = static_cast<std::size_t>(l.ranks()), me = static_cast<std::size_t>(shards_->rank());
  const std::size_t gsize = optimizer::grad_type_size(model_->grad_type());
  const dist::GpuType t = grad_gpu_type();
  auto* g = static_cast<char*>(model_->grads());
  zev_->grads_final[b].record(model_->stream());
  GHT_CUDA_TRY(cudaStreamWaitEvent(comm_stream_, zev_->grads_final[b].get(), 0));
  zev_->reduce_begin[b].record(comm_stream_);
  if (q > 0) gpu_comm_->reduce_scatter(g + a * gsize, g + (a + me * q) * gsize, q, t, dist::GpuReduce::avg, comm_stream_);
  if (n > ranks * q) gpu_comm_->allreduce(g + (a + ranks * q) * gsize, n - ranks * q, t, dist::GpuReduce::avg, comm_stream_);
  zev_->reduce_done[b].record(comm_stream_);
}

// ZeRO-1, after this rank's updates were queued: unit by unit, once the unit's regions are
// updated, every rank's bf16 weights of it land on every rank (an in-place all-gather of the even
// part, a broadcast of the last rank's remainder); the next forward waits for gathered[u] alone.
// Nothing waits on the host: the next step's reduce_gradients() bounds these by the deadline too.
void CudaRun::gather_weights() {
  if (!shards_) return;
  const dist::ShardLayout& l = shards_->layout();
  const auto ranks = static_cast<std::size_t>(l.ranks()), me = static_cast<std::size_t>(shards_->rank());
  __nv_bfloat16* w = model_->weights();
  for (std::size_t b = 0; b < l.buckets().size(); ++b) {
    for (std::size_t r : unit_regions_[b]) GHT_CUDA_TRY(cudaStreamWaitEvent(comm_stream_, opt_->region_event(r), 0));
    zev_->gather_begin[b].record(comm_stream_);
    const std::size_t a = l.buckets()[b].begin, n = l.buckets()[b].size(), q = l.even(b);
    if (q > 0) gpu_comm_->all_gather(w + a + me * q, w + a, q, dist::GpuType::bf16, comm_stream_);
    if (n > ranks * q) {
      gpu_comm_->broadcast(w + a + ranks * q, (n - ranks * q) * sizeof(__nv_bfloat16), l.ranks() - 1, comm_stream_);
    }
    zev_->gathered[b].record(comm_stream_);
  }
  gathers_queued_ = true;
}

// ZeRO-1 timings of the step that just ran: the reductions' GPU time (the sum over units, each
// from when the comm stream started it), the part of the comm stream's work after the last
// backward (what the norm waited for), and the all-gathers' time of the step before (this step's
// are still running).
void CudaRun::measure_comm(StepProfile& p) const {
  if (!shards_) return;
  const int A = cfg_.model.grad_accum;
  double ms = 0;
  for (std::size_t b = 0; b < unit_range_.size(); ++b) ms += elapsed_ms(zev_->reduce_begin[b], zev_->reduce_done[b]);
  p.dp_reduce_ms = ms;
  p.dp_reduce_exposed_ms = std::max(0.0, elapsed_ms(cur_->bwd_end[static_cast<std::size_t>(A - 1)], zev_->reduce_end));
  p.dp_gather_ms = prev_gather_ms_;
}

// The record's losses are the means over every rank's micro-batches; with DiLoCo so is the grad
// norm (each worker's own; data parallel's is the same on every rank).
void CudaRun::mean_over_ranks(double& loss, double& aux, double& grad_norm) const {
  const int n = s_.comm->size();
  if (n == 1) return;
  double m[3] = {loss, aux, grad_norm};
  s_.comm->allreduce_sum(m, 3);
  loss = m[0] / n;
  aux = m[1] / n;
  if (cfg_.diloco.on()) grad_norm = m[2] / n;
}

}  // namespace ght::trainer::cuda_run
