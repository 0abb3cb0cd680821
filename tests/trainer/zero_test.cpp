// ZeRO-1's per-rank slices of the model's tensors and their resume from shards of any number of
// ranks (trainer/zero.hpp), without MPI: the shards are made here as the ranks would write them.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tier/error.hpp"
#include "trainer/model.hpp"
#include "trainer/model_config.hpp"
#include "trainer/zero.hpp"

namespace {

using namespace ght::trainer;

const std::vector<NamedTensor>& tiny_tensors() {
  static const MoEModel<float> m(preset("tiny"));
  return m.tensors();
}

// The value of element i of tensor t (never zero, different per tensor and moment).
float value(std::size_t t, std::size_t i, int moment) {
  return 0.001f * static_cast<float>(i + 1) + static_cast<float>(t) + (moment == 0 ? 0.5f : -0.25f);
}

TEST(StateShards, EachTensorIsSplitIntoConsecutiveSlicesInRankOrder) {
  const auto& ts = tiny_tensors();
  for (int n : {1, 2, 3, 4}) {
    std::vector<std::size_t> next(ts.size(), 0);  // the first element of each tensor not yet seen
    std::size_t total = 0;
    for (int r = 0; r < n; ++r) {
      const StateShards z(ts, StateShards::whole_model(ts), n, r);
      EXPECT_EQ(z.owned(), z.layout().owned(r));
      total += z.owned();
      for (const TensorSlice& s : z.slices()) {
        EXPECT_EQ(s.first, next[s.tensor]) << ts[s.tensor].name << " rank " << r;
        next[s.tensor] = s.first + s.n;
      }
      const std::vector<ght::optimizer::Region> regs = z.regions(nullptr, ght::optimizer::GradType::fp32, nullptr);
      ASSERT_EQ(regs.size(), z.slices().size());
      for (std::size_t k = 0; k < regs.size(); ++k) {
        EXPECT_EQ(regs[k].name, ts[z.slices()[k].tensor].name);
        EXPECT_EQ(regs[k].first, z.slices()[k].first);
        EXPECT_EQ(regs[k].n, z.slices()[k].n);
      }
    }
    for (std::size_t t = 0; t < ts.size(); ++t) EXPECT_EQ(next[t], ts[t].numel) << ts[t].name;
    const StateShards z0(ts, StateShards::whole_model(ts), n, 0);
    EXPECT_EQ(total, ts.back().offset + ts.back().numel);
    for (std::size_t t = 0; t < ts.size(); ++t) {
      std::size_t sum = 0;
      for (std::size_t c : z0.tensor_counts(t)) sum += c;
      EXPECT_EQ(sum, ts[t].numel);
    }
  }
}

TEST(StateShards, BucketsMustNotCutATensor) {
  const auto& ts = tiny_tensors();
  const std::size_t cut = ts[1].offset + 1, end = ts.back().offset + ts.back().numel;
  EXPECT_THROW(StateShards(ts, {{0, cut}, {cut, end}}, 2, 0), ght::logic_error);
}

// What `ranks` ranks would write: each rank's zero.rank file as (metadata, tensors).
struct Shard {
  std::string file;
  ght::trainer::StMetadata meta;
  std::vector<CheckpointTensor> tensors;
};
std::vector<Shard> write_shards(int ranks) {
  const auto& ts = tiny_tensors();
  std::vector<Shard> out;
  for (int r = 0; r < ranks; ++r) {
    const StateShards z(ts, StateShards::whole_model(ts), ranks, r);
    Shard s{zero_shard_file(r), zero_shard_metadata(ts, z.slices(), r, ranks), {}};
    for (int i = 0; i < 2; ++i) {
      for (const TensorSlice& x : z.slices()) {
        CheckpointTensor c{std::string(i == 0 ? "adam_m." : "adam_v.") + ts[x.tensor].name, {static_cast<std::int64_t>(x.n)}, {}};
        for (std::size_t k = 0; k < x.n; ++k) c.data.push_back(value(x.tensor, x.first + k, i));
        s.tensors.push_back(std::move(c));
      }
    }
    out.push_back(std::move(s));
  }
  return out;
}

void feed(SliceAssembler& a, const std::vector<Shard>& shards, const std::string& dir = "ckpt") {
  for (const Shard& s : shards) {
    for (const CheckpointTensor& t : s.tensors) a.take(dir, s.file, s.meta, {t.name, t.shape, t.data});
  }
}

TEST(SliceAssembler, ReshardsTheShardsOfAnyNumberOfRanks) {
  const auto& ts = tiny_tensors();
  for (int saved : {1, 2, 3, 4}) {
    const std::vector<Shard> shards = write_shards(saved);
    for (int now : {1, 2, 3}) {
      for (int r = 0; r < now; ++r) {
        const StateShards z(ts, StateShards::whole_model(ts), now, r);
        SliceAssembler a(ts, z.slices());
        feed(a, shards);
        ASSERT_NO_THROW(a.check_complete("ckpt", saved));
        for (std::size_t k = 0; k < z.slices().size(); ++k) {
          const TensorSlice& x = z.slices()[k];
          for (std::size_t e = 0; e < x.n; ++e) {
            ASSERT_EQ(a.m(k)[e], value(x.tensor, x.first + e, 0)) << saved << " -> " << now << " ranks, " << ts[x.tensor].name;
            ASSERT_EQ(a.v(k)[e], value(x.tensor, x.first + e, 1));
          }
        }
      }
    }
  }
  // Every tensor whole (a backend whose state is not sharded) from the shards of 3 ranks.
  SliceAssembler whole(ts, whole_tensors(ts));
  feed(whole, write_shards(3));
  EXPECT_NO_THROW(whole.check_complete("ckpt", 3));
  EXPECT_EQ(whole.v(2)[5], value(2, 5, 1));
}

TEST(SliceAssembler, AMissingOrRepeatedShardIsNamed) {
  const auto& ts = tiny_tensors();
  std::vector<Shard> shards = write_shards(3);
  shards.erase(shards.begin() + 1);  // rank 1's file is not in the manifest
  SliceAssembler a(ts, whole_tensors(ts));
  feed(a, shards);
  try {
    a.check_complete("ckpt", 3);
    ADD_FAILURE() << "a missing shard passed";
  } catch (const ght::io_error& e) {
    EXPECT_NE(std::string(e.what()).find("zero.rank_00001.safetensors"), std::string::npos) << e.what();
  }
  // Rank 0's shard read twice: its values come twice.
  SliceAssembler b(ts, whole_tensors(ts));
  std::vector<Shard> twice = write_shards(2);
  twice.push_back(twice[0]);
  feed(b, twice);
  EXPECT_THROW(b.check_complete("ckpt", 2), ght::io_error);  // rank 0's values came twice
  // A new checkpoint directory starts over.
  SliceAssembler c(ts, whole_tensors(ts));
  feed(c, write_shards(2), "old");
  feed(c, write_shards(3), "new");
  EXPECT_NO_THROW(c.check_complete("new", 3));
}

TEST(SliceAssembler, RejectsAShardWithoutSlices) {
  const auto& ts = tiny_tensors();
  SliceAssembler a(ts, whole_tensors(ts));
  const std::vector<float> d(4, 1.0f);
  EXPECT_THROW(a.take("ckpt", "zero.rank_00000.safetensors", {{"format", "pt"}}, {"adam_m.x", {4}, d}), ght::io_error);
}

}  // namespace
