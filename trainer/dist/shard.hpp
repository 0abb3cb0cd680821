#pragma once
/**
 * @file shard.hpp
 * @brief How N ranks split a flat parameter space for ZeRO-1 (sharded optimizer state).
 *
 * The space is cut into buckets (consecutive ranges: the whole model on the CPU backend, one per
 * model unit on the CUDA backend, so that a unit's gradients can be reduced as soon as its
 * backward ends). Each bucket of n elements is split over the ranks: with q = floor(n / (N·a))·a
 * (a = the alignment), rank r < N−1 holds [begin + r·q, begin + (r+1)·q) and the last rank the
 * rest, [begin + (N−1)·q, end): at most N·a − 1 elements more than the others. Each piece then
 * starts a multiple of a elements into its bucket (16-byte vectors, NCCL's alignment), and the
 * first N·q elements of a bucket are an even split: one ncclReduceScatter / ncclAllGather in
 * place, plus a small all-reduce / broadcast of the remainder, which the last rank holds.
 *
 * The pieces of a bucket, in rank order, tile it: so do their intersections with any range
 * inside it (a tensor), which is what gathering a tensor's shards relies on. Pure arithmetic: no
 * MPI, NCCL or CUDA.
 */
#include <cstddef>
#include <vector>

namespace ght::dist {

/// A half-open range [begin, end) of a flat parameter space.
struct Range {
  std::size_t begin = 0, end = 0;
  [[nodiscard]] std::size_t size() const noexcept { return end - begin; }
  [[nodiscard]] bool empty() const noexcept { return end == begin; }
  friend bool operator==(const Range&, const Range&) = default;
};

/// Elements a piece's offset within its bucket is a multiple of (64 bytes of fp32).
inline constexpr std::size_t kShardAlign = 16;

class ShardLayout {
 public:
  /**
   * @param buckets consecutive non-empty ranges (each begins where the one before ends)
   * @param ranks N >= 1
   * @param align the alignment a >= 1 of the pieces within their bucket
   * @throws ght::logic_error for empty or non-consecutive buckets, ranks < 1 or align < 1
   */
  ShardLayout(std::vector<Range> buckets, int ranks, std::size_t align = kShardAlign);

  [[nodiscard]] int ranks() const noexcept { return ranks_; }
  [[nodiscard]] const std::vector<Range>& buckets() const noexcept { return buckets_; }
  /// Elements every rank holds of bucket b's even part (q above, a multiple of the alignment).
  [[nodiscard]] std::size_t even(std::size_t b) const;
  /// Rank r's piece of bucket b (the last rank's runs to the bucket's end; may be empty).
  [[nodiscard]] Range piece(std::size_t b, int r) const;
  /// Piece sizes of bucket b in rank order: the block counts of a collective over the bucket.
  [[nodiscard]] std::vector<std::size_t> counts(std::size_t b) const;
  /// Elements rank r holds over all buckets.
  [[nodiscard]] std::size_t owned(int r) const;
  /// The parts of `x` that rank r holds: x ∩ each of r's pieces, non-empty ones, in order.
  [[nodiscard]] std::vector<Range> intersect(Range x, int r) const;

 private:
  std::vector<Range> buckets_;
  int ranks_;
  std::size_t align_;
};

}  // namespace ght::dist
