#pragma once
/**
 * @file zero.hpp
 * @brief ZeRO-1 (Rajbhandari et al. 2020, stage 1) over the ranks of a data-parallel run: each
 * rank holds the optimizer state (fp32 master, m, v) of its shard of the parameters only, in the
 * tier its plan gives it, and updates it with the optimizer paths that exist.
 *
 * A step, on either backend: every rank computes its micro-batches' gradients over the whole
 * model; they are reduce-scattered (each rank gets the sum over ranks of its shard); each rank's
 * AdamW updates its shard, with the gradient norm over the whole model (sumsq_over_ranks: the Σg²
 * of every shard, in double, added in rank order, the same on every rank), so clipping and the
 * non-finite skip are those of the whole model; the updated weights are all-gathered.
 *
 * The shard layout is a dist::ShardLayout over buckets of whole tensors (the CPU backend: one
 * bucket, so each rank holds one contiguous 1/N of the flat parameters; the CUDA backend: one per
 * model unit). A rank's shard meets each tensor in at most one slice: its optimizer regions are
 * those slices (TensorSlice), named by their tensor, with optimizer::Region::first at the slice's
 * offset so that bf16 state rounds as the whole tensor's would.
 *
 * Checkpoints (trainer/loop.cpp): model.safetensors holds the whole fp32 master, gathered one
 * tensor at a time (rank 0 writes it); every rank writes the m and v of its slices to
 * zero.rank_NNNNN.safetensors (metadata "slices": {tensor: [first, n]}); rank 0 commits once all
 * are written. On resume every rank takes the parts it holds now from whatever the checkpoint
 * has (SliceAssembler): whole tensors, or the shards of any number of ranks (resharding).
 */
#include <cstddef>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "optimizer/adamw.hpp"
#include "trainer/checkpoint.hpp"
#include "trainer/dist/comm.hpp"
#include "trainer/dist/shard.hpp"
#include "trainer/model.hpp"

namespace ght::trainer {

/// An optimizer region's part of a parameter tensor: elements [first, first + n) of tensor `tensor`.
struct TensorSlice {
  std::size_t tensor = 0, first = 0, n = 0;
};

/// Every tensor whole, in order: the regions of a backend whose state is not sharded.
[[nodiscard]] std::vector<TensorSlice> whole_tensors(const std::vector<NamedTensor>& tensors);

class StateShards {
 public:
  /**
   * @param tensors the model's parameter tensors (increasing offsets, not overlapping)
   * @param buckets consecutive ranges of the flat parameters, each made of whole tensors
   * @throws ght::logic_error for a bucket that cuts a tensor, or ranks/rank out of range
   */
  StateShards(const std::vector<NamedTensor>& tensors, std::vector<dist::Range> buckets, int ranks, int rank);
  /// One bucket holding every tensor.
  [[nodiscard]] static std::vector<dist::Range> whole_model(const std::vector<NamedTensor>& tensors);

  [[nodiscard]] const dist::ShardLayout& layout() const noexcept { return layout_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int ranks() const noexcept { return layout_.ranks(); }
  /// This rank's optimizer regions, in tensor order (tensors it holds nothing of are left out).
  [[nodiscard]] const std::vector<TensorSlice>& slices() const noexcept { return slices_; }
  /// Parameters this rank holds.
  [[nodiscard]] std::size_t owned() const noexcept;
  /// How many elements of tensor t each rank holds, in rank order: they are consecutive
  /// slices from the tensor's start, the block counts of gathering it (Communicator::all_gather).
  [[nodiscard]] std::vector<std::size_t> tensor_counts(std::size_t t) const;
  /// The optimizer regions of slices(): name, size, first and weight decay from the tensor;
  /// gradient and weight at their flat offset from the bases (a null base: null).
  [[nodiscard]] std::vector<optimizer::Region> regions(const void* grad_base, optimizer::GradType grad_type,
                                                       void* weight_base) const;

 private:
  const std::vector<NamedTensor>& tensors_;
  dist::ShardLayout layout_;
  int rank_;
  std::vector<TensorSlice> slices_;
};

/// Why GHT_OPT_DELAY=1 is refused with sharded state on `ranks` ranks (both backends).
[[nodiscard]] std::string delay_with_shards_message(int ranks);

/// AdamWOptions::combine_sumsq over `comm`: every rank's Σg² gathered and added in rank order.
[[nodiscard]] std::function<double(double)> sumsq_over_ranks(dist::Communicator& comm);

/// "zero.rank_00003.safetensors"; the prefix all of them share.
[[nodiscard]] std::string zero_shard_file(int rank);
inline constexpr const char* kZeroShardPrefix = "zero.rank_";

/// Tensors "adam_m.<name>", "adam_v.<name>" of a rank's slices, and the metadata naming the slices.
[[nodiscard]] StMetadata zero_shard_metadata(const std::vector<NamedTensor>& tensors,
                                             const std::vector<TensorSlice>& slices, int rank, int ranks);

/**
 * @brief The m and v of one rank's optimizer regions, assembled on resume from what a checkpoint
 * holds: whole tensors (replicated state; fill_from_whole) or the zero.rank_* shards of any
 * number of ranks, streamed through take() (LoadOptions::stream).
 */
class SliceAssembler {
 public:
  SliceAssembler(const std::vector<NamedTensor>& tensors, std::vector<TensorSlice> slices);
  /// LoadOptions::stream for the zero.rank_* files (a new ckpt_dir starts over).
  void take(const std::string& ckpt_dir, const std::string& file, const StMetadata& meta,
            const CheckpointTensorView& t);
  /// Whole m and v tensors of a checkpoint without shards.
  void fill_from_whole(const std::string& ckpt_dir, const std::vector<CheckpointTensor>& m,
                       const std::vector<CheckpointTensor>& v);
  /// Every one of the saved ranks' shards was read, and every element of every region came from
  /// exactly one place. @throws ght::io_error naming the checkpoint and the missing file or tensor
  void check_complete(const std::string& ckpt_dir, int saved_ranks) const;
  [[nodiscard]] std::span<const float> m(std::size_t region) const { return m_[region]; }
  [[nodiscard]] std::span<const float> v(std::size_t region) const { return v_[region]; }

 private:
  void start(const std::string& ckpt_dir);
  // Tensor `name`'s elements [first, first + data.size()) into moment i's regions.
  void put(int i, const std::string& name, std::size_t first, std::span<const float> data);
  const std::vector<NamedTensor>& tensors_;
  std::vector<TensorSlice> slices_;
  std::vector<std::vector<float>> m_, v_;
  std::vector<std::size_t> covered_[2];
  std::string dir_;
  std::set<std::string> files_;
};

}  // namespace ght::trainer
