// ZeRO-1's shard layout (trainer/dist/shard.hpp): pure arithmetic, checked against its definition.
#include <gtest/gtest.h>

#include <vector>

#include "tier/error.hpp"
#include "trainer/dist/shard.hpp"

namespace {

using ght::dist::Range;
using ght::dist::ShardLayout;

TEST(ShardLayout, PiecesTileEachBucketAlignedWithTheRemainderOnTheLastRank) {
  // Buckets of odd sizes, one smaller than ranks x alignment.
  const std::vector<Range> buckets = {{0, 1000}, {1000, 1033}, {1033, 5000}};
  for (int n : {1, 2, 3, 4, 7}) {
    const ShardLayout l(buckets, n);
    std::size_t total = 0;
    for (int r = 0; r < n; ++r) total += l.owned(r);
    EXPECT_EQ(total, 5000u) << n << " ranks";
    for (std::size_t b = 0; b < buckets.size(); ++b) {
      const std::size_t q = l.even(b);
      EXPECT_EQ(q % ght::dist::kShardAlign, 0u);
      EXPECT_EQ(q, buckets[b].size() / (static_cast<std::size_t>(n) * 16) * 16);
      std::size_t at = buckets[b].begin;
      for (int r = 0; r < n; ++r) {
        const Range p = l.piece(b, r);
        EXPECT_EQ(p.begin, at) << "bucket " << b << " rank " << r;
        EXPECT_EQ(p.size(), r + 1 < n ? q : buckets[b].size() - (n - 1) * q);
        EXPECT_EQ(l.counts(b)[static_cast<std::size_t>(r)], p.size());
        at = p.end;
      }
      EXPECT_EQ(at, buckets[b].end);
      // The last rank holds fewer than ranks x alignment more than the others.
      EXPECT_LT(l.piece(b, n - 1).size() - q, static_cast<std::size_t>(n) * 16);
    }
  }
  // 1033 - 1000 = 33 elements over 4 ranks: no even part, all on the last rank.
  const ShardLayout four(buckets, 4);
  EXPECT_EQ(four.even(1), 0u);
  EXPECT_TRUE(four.piece(1, 0).empty());
  EXPECT_EQ(four.piece(1, 3), (Range{1000, 1033}));
}

TEST(ShardLayout, IntersectGivesTheRanksPartsOfARangeInOrder) {
  const ShardLayout l({{0, 640}, {640, 1280}}, 2);  // pieces: [0,320) [320,640) | [640,960) [960,1280)
  EXPECT_EQ(l.intersect({300, 700}, 0), (std::vector<Range>{{300, 320}, {640, 700}}));
  EXPECT_EQ(l.intersect({300, 700}, 1), (std::vector<Range>{{320, 640}}));
  EXPECT_TRUE(l.intersect({0, 320}, 1).empty());
  EXPECT_EQ(l.intersect({1000, 1280}, 1), (std::vector<Range>{{1000, 1280}}));
}

TEST(ShardLayout, RejectsBadBucketsAndRanks) {
  EXPECT_THROW(ShardLayout({{0, 10}, {11, 20}}, 2), ght::logic_error);  // a hole
  EXPECT_THROW(ShardLayout({{0, 10}, {10, 10}}, 2), ght::logic_error);  // an empty bucket
  EXPECT_THROW(ShardLayout({}, 2), ght::logic_error);
  EXPECT_THROW(ShardLayout({{0, 10}}, 0), ght::logic_error);
  const ShardLayout l({{0, 10}}, 2);
  EXPECT_THROW((void)l.piece(0, 2), ght::logic_error);
  EXPECT_THROW((void)l.piece(1, 0), ght::logic_error);
}

}  // namespace
