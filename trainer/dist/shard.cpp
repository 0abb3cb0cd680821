#include "trainer/dist/shard.hpp"

#include <algorithm>
#include <string>

#include "tier/error.hpp"

namespace ght::dist {

ShardLayout::ShardLayout(std::vector<Range> buckets, int ranks, std::size_t align)
    : buckets_(std::move(buckets)), ranks_(ranks), align_(align) {
  GHT_EXPECTS(ranks >= 1, "ShardLayout: ranks must be >= 1, got " + std::to_string(ranks));
  GHT_EXPECTS(align >= 1, "ShardLayout: the alignment must be >= 1");
  GHT_EXPECTS(!buckets_.empty(), "ShardLayout: no buckets");
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    const Range& x = buckets_[b];
    GHT_EXPECTS(x.end > x.begin, "ShardLayout: bucket " + std::to_string(b) + " [" + std::to_string(x.begin) + ", " +
                                     std::to_string(x.end) + ") is empty");
    GHT_EXPECTS(b == 0 || x.begin == buckets_[b - 1].end,
                "ShardLayout: bucket " + std::to_string(b) + " begins at " + std::to_string(x.begin) +
                    ", not where bucket " + std::to_string(b - 1) + " ends (" + std::to_string(buckets_[b - 1].end) + ")");
  }
}

std::size_t ShardLayout::even(std::size_t b) const {
  GHT_EXPECTS(b < buckets_.size(), "ShardLayout: no bucket " + std::to_string(b));
  const std::size_t unit = static_cast<std::size_t>(ranks_) * align_;
  return buckets_[b].size() / unit * align_;
}

Range ShardLayout::piece(std::size_t b, int r) const {
  GHT_EXPECTS(r >= 0 && r < ranks_, "ShardLayout: rank " + std::to_string(r) + " is not one of " + std::to_string(ranks_));
  const std::size_t q = even(b), a = buckets_[b].begin;
  const auto ur = static_cast<std::size_t>(r);
  if (r == ranks_ - 1) return {a + ur * q, buckets_[b].end};
  return {a + ur * q, a + (ur + 1) * q};
}

std::vector<std::size_t> ShardLayout::counts(std::size_t b) const {
  std::vector<std::size_t> c(static_cast<std::size_t>(ranks_));
  for (int r = 0; r < ranks_; ++r) c[static_cast<std::size_t>(r)] = piece(b, r).size();
  return c;
}

std::size_t ShardLayout::owned(int r) const {
  std::size_t n = 0;
  for (std::size_t b = 0; b < buckets_.size(); ++b) n += piece(b, r).size();
  return n;
}

std::vector<Range> ShardLayout::intersect(Range x, int r) const {
  std::vector<Range> out;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].end <= x.begin) continue;
    if (buckets_[b].begin >= x.end) break;
    const Range p = piece(b, r);
    const Range i{std::max(p.begin, x.begin), std::min(p.end, x.end)};
    if (i.end > i.begin) out.push_back(i);
  }
  return out;
}

}  // namespace ght::dist
