#pragma once
// Internal to the two cuDNN attention paths (attention_cudnn.cpp: the backend-descriptor graph;
// cudnn_frontend/attention_sdpa.cpp: cudnn-frontend's SDPA nodes): one cuDNN handle per device,
// one mutex around every (cudnnSetStream, execute) pair on it, and a per-shape cache of built
// plans that remembers the shapes cuDNN cannot run. Plain C++; include only where <cudnn.h> is.
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <utility>

#include "kernels/cuda/attention.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cuda::detail {

struct CudnnAttentionKey {
  int device = 0;
  bool backward = false;
  std::int64_t B = 0, T = 0, H = 0, KV = 0, D = 0, q_row = 0, k_row = 0, v_row = 0, o_row = 0;

  static CudnnAttentionKey of(int device, bool backward, const AttentionShape& s) {
    return {device, backward, s.B, s.T, s.H, s.KV, s.D, s.q_row, s.k_row, s.v_row, s.o_row};
  }
  bool operator<(const CudnnAttentionKey& o) const {
    return std::tie(device, backward, B, T, H, KV, D, q_row, k_row, v_row, o_row) <
           std::tie(o.device, o.backward, o.B, o.T, o.H, o.KV, o.D, o.q_row, o.k_row, o.v_row,
                    o.o_row);
  }
};

/// Guards the handles, both plan caches and every use of a handle (its stream is set per call).
std::mutex& cudnn_attention_mutex();
/// The handle of `device`, created on first use. Call with cudnn_attention_mutex() held.
cudnnHandle_t cudnn_handle_locked(int device);
/// The current CUDA device.
int cudnn_current_device();

/// Built plans by shape; nullptr records a shape for which no engine could be built.
template <class Plan>
class CudnnPlanCache {
 public:
  /**
   * The cached plan, or build(key) on first use. A build that throws ght::cuda_error is
   * remembered as unsupported; the error propagates when throw_on_failure, else nullptr.
   */
  template <class Build>
  std::shared_ptr<Plan> get(const CudnnAttentionKey& key, bool throw_on_failure, Build&& build) {
    auto it = plans_.find(key);
    if (it != plans_.end()) {
      if (!it->second && throw_on_failure)
        throw ght::cuda_error("cuDNN attention: an earlier attempt found no engine for this shape");
      return it->second;
    }
    std::shared_ptr<Plan> p;
    try {
      p = std::forward<Build>(build)(key);
    } catch (const ght::cuda_error&) {
      plans_.emplace(key, nullptr);
      if (throw_on_failure) throw;
      return nullptr;
    }
    plans_.emplace(key, p);
    return p;
  }
  void clear() { plans_.clear(); }

 private:
  std::map<CudnnAttentionKey, std::shared_ptr<Plan>> plans_;
};

}  // namespace ght::kernels::cuda::detail
