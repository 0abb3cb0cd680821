#include "trainer/zero.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>

#include "tier/error.hpp"

namespace ght::trainer {

std::vector<TensorSlice> whole_tensors(const std::vector<NamedTensor>& tensors) {
  std::vector<TensorSlice> s;
  s.reserve(tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) s.push_back({t, 0, tensors[t].numel});
  return s;
}

StateShards::StateShards(const std::vector<NamedTensor>& tensors, std::vector<dist::Range> buckets, int ranks,
                         int rank)
    : tensors_(tensors), layout_(std::move(buckets), ranks), rank_(rank) {
  GHT_EXPECTS(rank >= 0 && rank < ranks, "StateShards: rank " + std::to_string(rank) + " of " + std::to_string(ranks));
  const auto& bs = layout_.buckets();
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const NamedTensor& x = tensors[t];
    const dist::Range r{x.offset, x.offset + x.numel};
    // A tensor inside one bucket meets each rank's piece of it in at most one slice.
    const bool inside = std::any_of(bs.begin(), bs.end(), [&](const dist::Range& b) {
      return b.begin <= r.begin && r.end <= b.end;
    });
    GHT_EXPECTS(inside, "StateShards: tensor " + x.name + " [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                            ") is not inside one bucket");
    const std::vector<dist::Range> mine = layout_.intersect(r, rank);
    GHT_EXPECTS(mine.size() <= 1, "StateShards: tensor " + x.name + " meets rank " + std::to_string(rank) +
                                      "'s shard in " + std::to_string(mine.size()) + " pieces");
    if (!mine.empty()) slices_.push_back({t, mine[0].begin - x.offset, mine[0].size()});
  }
}

std::vector<dist::Range> StateShards::whole_model(const std::vector<NamedTensor>& tensors) {
  GHT_EXPECTS(!tensors.empty(), "StateShards: no tensors");
  std::size_t lo = tensors[0].offset, hi = 0;
  for (const NamedTensor& t : tensors) {
    lo = std::min(lo, t.offset);
    hi = std::max(hi, t.offset + t.numel);
  }
  return {{lo, hi}};
}

std::size_t StateShards::owned() const noexcept {
  std::size_t n = 0;
  for (const TensorSlice& s : slices_) n += s.n;
  return n;
}

std::vector<std::size_t> StateShards::tensor_counts(std::size_t t) const {
  const NamedTensor& x = tensors_.at(t);
  std::vector<std::size_t> c(static_cast<std::size_t>(ranks()), 0);
  for (int r = 0; r < ranks(); ++r) {
    for (const dist::Range& p : layout_.intersect({x.offset, x.offset + x.numel}, r)) c[static_cast<std::size_t>(r)] += p.size();
  }
  return c;
}

std::vector<optimizer::Region> StateShards::regions(const void* grad_base, optimizer::GradType grad_type,
                                                    void* weight_base) const {
  std::vector<optimizer::Region> out;
  const std::size_t gsize = optimizer::grad_type_size(grad_type);
  for (const TensorSlice& s : slices_) {
    const NamedTensor& t = tensors_[s.tensor];
    const std::size_t at = t.offset + s.first;
    optimizer::Region g;
    g.name = t.name;
    g.n = s.n;
    g.first = s.first;
    g.weight_decay = t.decay;
    g.grad = grad_base != nullptr ? static_cast<const char*>(grad_base) + at * gsize : nullptr;
    g.grad_type = grad_type;
    g.weight = weight_base != nullptr ? static_cast<optimizer::bf16*>(weight_base) + at : nullptr;
    out.push_back(std::move(g));
  }
  return out;
}

std::string delay_with_shards_message(int ranks) {
  return "GHT_OPT_DELAY=1 with sharded optimizer state (dist.optimizer_state=sharded, the default, on " +
         std::to_string(ranks) + " ranks): the delayed update is not built for ZeRO-1; set -o "
         "dist.optimizer_state=replicated or unset GHT_OPT_DELAY";
}

std::function<double(double)> sumsq_over_ranks(dist::Communicator& comm) {
  return [&comm](double mine) {
    // Gathered, then added in rank order: the same double on every rank, whatever order MPI's
    // reduction would have used.
    std::vector<double> all(static_cast<std::size_t>(comm.size()), 0.0);
    all[static_cast<std::size_t>(comm.rank())] = mine;
    const std::vector<std::size_t> one(all.size(), 1);
    comm.all_gather(all.data(), one);
    double total = 0;
    for (double x : all) total += x;
    return total;
  };
}

std::string zero_shard_file(int rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%s%05d.safetensors", kZeroShardPrefix, rank);
  return buf;
}

namespace {
constexpr const char* kMoment[2] = {"adam_m.", "adam_v."};
}  // namespace

StMetadata zero_shard_metadata(const std::vector<NamedTensor>& tensors, const std::vector<TensorSlice>& slices,
                               int rank, int ranks) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const TensorSlice& s : slices) j[tensors[s.tensor].name] = {s.first, s.n};
  return {{"format", "pt"}, {"rank", std::to_string(rank)}, {"ranks", std::to_string(ranks)}, {"slices", j.dump()}};
}

SliceAssembler::SliceAssembler(const std::vector<NamedTensor>& tensors, std::vector<TensorSlice> slices)
    : tensors_(tensors), slices_(std::move(slices)) {}

void SliceAssembler::start(const std::string& ckpt_dir) {
  if (ckpt_dir == dir_ && !m_.empty()) return;
  dir_ = ckpt_dir;
  files_.clear();
  m_.assign(slices_.size(), {});
  v_.assign(slices_.size(), {});
  for (std::size_t r = 0; r < slices_.size(); ++r) {
    m_[r].assign(slices_[r].n, 0.0f);
    v_[r].assign(slices_[r].n, 0.0f);
  }
  for (auto& c : covered_) c.assign(slices_.size(), 0);
}

void SliceAssembler::put(int i, const std::string& name, std::size_t first, std::span<const float> data) {
  for (std::size_t r = 0; r < slices_.size(); ++r) {
    const TensorSlice& s = slices_[r];
    if (tensors_[s.tensor].name != name) continue;
    const std::size_t lo = std::max(first, s.first), hi = std::min(first + data.size(), s.first + s.n);
    if (lo >= hi) continue;
    std::copy(data.begin() + static_cast<std::ptrdiff_t>(lo - first), data.begin() + static_cast<std::ptrdiff_t>(hi - first),
              (i == 0 ? m_ : v_)[r].begin() + static_cast<std::ptrdiff_t>(lo - s.first));
    covered_[i][r] += hi - lo;
  }
}

void SliceAssembler::take(const std::string& ckpt_dir, const std::string& file, const StMetadata& meta,
                          const CheckpointTensorView& t) {
  start(ckpt_dir);
  files_.insert(file);
  const auto it = meta.find("slices");
  if (it == meta.end()) throw io_error("checkpoint " + ckpt_dir + ": " + file + " has no \"slices\" metadata");
  nlohmann::json slices;
  try {
    slices = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw io_error("checkpoint " + ckpt_dir + ": " + file + ": malformed \"slices\" metadata: " + e.what());
  }
  for (int i = 0; i < 2; ++i) {
    if (!t.name.starts_with(kMoment[i])) continue;
    const std::string name = t.name.substr(std::string(kMoment[i]).size());
    const auto s = slices.find(name);
    if (s == slices.end() || !s->is_array() || s->size() != 2 || (*s)[1].get<std::size_t>() != t.data.size()) {
      throw io_error("checkpoint " + ckpt_dir + ": " + file + ": tensor " + t.name +
                     " has no slice of its size in the \"slices\" metadata");
    }
    put(i, name, (*s)[0].get<std::size_t>(), t.data);
    return;
  }
  throw io_error("checkpoint " + ckpt_dir + ": " + file + ": unexpected tensor " + t.name);
}

void SliceAssembler::fill_from_whole(const std::string& ckpt_dir, const std::vector<CheckpointTensor>& m,
                                     const std::vector<CheckpointTensor>& v) {
  start(ckpt_dir);
  for (const CheckpointTensor& x : m) put(0, x.name, 0, x.data);
  for (const CheckpointTensor& x : v) put(1, x.name, 0, x.data);
}

void SliceAssembler::check_complete(const std::string& ckpt_dir, int saved_ranks) const {
  for (int r = 0; r < saved_ranks; ++r) {
    if (!files_.contains(zero_shard_file(r))) {
      throw io_error("checkpoint " + ckpt_dir + ": its manifest lists no " + zero_shard_file(r) +
                     ", the optimizer state of rank " + std::to_string(r) + " of the " + std::to_string(saved_ranks) +
                     " that wrote it");
    }
  }
  for (std::size_t r = 0; r < slices_.size(); ++r) {
    for (int i = 0; i < 2; ++i) {
      const std::size_t got = covered_[i].empty() ? 0 : covered_[i][r];
      if (got != slices_[r].n) {
        throw io_error("checkpoint " + ckpt_dir + ": " + std::to_string(got) + " of the " + std::to_string(slices_[r].n) +
                       " " + std::string(kMoment[i]) + tensors_[slices_[r].tensor].name +
                       " values this rank needs were found (missing or overlapping shards)");
      }
    }
  }
}

}  // namespace ght::trainer
