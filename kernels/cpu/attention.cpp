#include "kernels/cpu/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/detail/common.hpp"

namespace ght::kernels::cpu {

namespace {

inline bool visible(const std::int32_t* doc, int i, int j) {
  return doc == nullptr || doc[j] == doc[i];
}

// (T, D) rows of one kv head, strided by kv_stride, into a dense (D, T) matrix, so that the
// scores of one query against all keys vectorise over j.
template <class T>
void transpose_head(T* dst, const T* src, std::int64_t kv_stride, int T_, int D) {
  for (int j = 0; j < T_; ++j)
    for (int d = 0; d < D; ++d) dst[static_cast<std::int64_t>(d) * T_ + j] = src[j * kv_stride + d];
}

// s[j] = sum_d q[d]·mT[d, j] for j <= i.
template <class T>
void scores_row(T* s, const T* q, const T* mT, int T_, int D, int i) {
  for (int j = 0; j <= i; ++j) s[j] = 0;
  for (int d = 0; d < D; ++d) {
    const T qd = q[d];
    const T* row = mT + static_cast<std::int64_t>(d) * T_;
#pragma omp simd
    for (int j = 0; j <= i; ++j) s[j] += qd * row[j];
  }
}

}  // namespace

template <class T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v,
                       const std::int32_t* doc_ids, int B, int T_, int H, int KV, int D) {
  const int rep = H / KV;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  const std::int64_t q_stride = static_cast<std::int64_t>(H) * D;   // between tokens in q/out
  const std::int64_t kv_stride = static_cast<std::int64_t>(KV) * D; // between tokens in k/v
  const std::int64_t work = static_cast<std::int64_t>(B) * H * T_ * T_ * D;
#pragma omp parallel if(detail::worth_parallel(work))
  {
    std::vector<T> kT(static_cast<std::size_t>(D) * T_), s(T_);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int h = 0; h < H; ++h) {
        const std::int32_t* doc = doc_ids ? doc_ids + static_cast<std::int64_t>(b) * T_ : nullptr;
        const int g = h / rep;
        const T* kb = k + static_cast<std::int64_t>(b) * T_ * kv_stride + g * D;
        const T* vb = v + static_cast<std::int64_t>(b) * T_ * kv_stride + g * D;
        transpose_head(kT.data(), kb, kv_stride, T_, D);
        for (int i = 0; i < T_; ++i) {
          const std::int64_t qo = (static_cast<std::int64_t>(b) * T_ + i) * q_stride + h * D;
          scores_row(s.data(), q + qo, kT.data(), T_, D, i);
          T mx = -std::numeric_limits<T>::infinity();
          for (int j = 0; j <= i; ++j) {
            if (!visible(doc, i, j)) continue;
            s[j] *= scale;
            mx = std::max(mx, s[j]);
          }
          T sum = 0;
          for (int j = 0; j <= i; ++j) {
            s[j] = visible(doc, i, j) ? std::exp(s[j] - mx) : T(0);
            sum += s[j];
          }
          const T inv = T(1) / sum;
          T* oi = out + qo;
          for (int d = 0; d < D; ++d) oi[d] = 0;
          for (int j = 0; j <= i; ++j) {
            if (s[j] == T(0)) continue;  // masked (or underflowed: contributes nothing)
            const T p = s[j] * inv;
            const T* vj = vb + j * kv_stride;
#pragma omp simd
            for (int d = 0; d < D; ++d) oi[d] += p * vj[d];
          }
          lse[(static_cast<std::int64_t>(b) * H + h) * T_ + i] = mx + std::log(sum);
        }
      }
    }
  }
}

template <class T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v,
                        const T* out, const T* lse, const std::int32_t* doc_ids, int B, int T_,
                        int H, int KV, int D) {
  const int rep = H / KV;
  const T scale = T(1) / std::sqrt(static_cast<T>(D));
  const std::int64_t q_stride = static_cast<std::int64_t>(H) * D;
  const std::int64_t kv_stride = static_cast<std::int64_t>(KV) * D;
  const std::int64_t work = static_cast<std::int64_t>(B) * H * T_ * T_ * D;
  // One task per (batch, kv head): the query heads that share a kv head accumulate into the same
  // dk/dv rows, so they run in order inside one task (no atomics, thread-count independent).
#pragma omp parallel if(detail::worth_parallel(work))
  {
    std::vector<T> kT(static_cast<std::size_t>(D) * T_), vT(kT.size()), s(T_), dp(T_);
#pragma omp for collapse(2) schedule(static)
    for (int b = 0; b < B; ++b) {
      for (int g = 0; g < KV; ++g) {
        const std::int32_t* doc = doc_ids ? doc_ids + static_cast<std::int64_t>(b) * T_ : nullptr;
        const std::int64_t kv0 = static_cast<std::int64_t>(b) * T_ * kv_stride + g * D;
        transpose_head(kT.data(), k + kv0, kv_stride, T_, D);
        transpose_head(vT.data(), v + kv0, kv_stride, T_, D);
        for (int j = 0; j < T_; ++j) {
          for (int d = 0; d < D; ++d) {
            dk[kv0 + j * kv_stride + d] = 0;
            dv[kv0 + j * kv_stride + d] = 0;
          }
        }
        for (int h = g * rep; h < (g + 1) * rep; ++h) {
          for (int i = 0; i < T_; ++i) {
            const std::int64_t qo = (static_cast<std::int64_t>(b) * T_ + i) * q_stride + h * D;
            const T* qi = q + qo;
            const T* doi = dout + qo;
            const T* oi = out + qo;
            const T l = lse[(static_cast<std::int64_t>(b) * H + h) * T_ + i];
            T di = 0;  // sum_j p_j·(dout_i·v_j) = dout_i·out_i
            for (int d = 0; d < D; ++d) di += doi[d] * oi[d];
            scores_row(s.data(), qi, kT.data(), T_, D, i);
            scores_row(dp.data(), doi, vT.data(), T_, D, i);
            T* dqi = dq + qo;
            for (int d = 0; d < D; ++d) dqi[d] = 0;
            for (int j = 0; j <= i; ++j) {
              if (!visible(doc, i, j)) continue;
              const T pj = std::exp(s[j] * scale - l);
              const T ds = pj * (dp[j] - di) * scale;
              const T* kj = k + kv0 + j * kv_stride;
              T* dkj = dk + kv0 + j * kv_stride;
              T* dvj = dv + kv0 + j * kv_stride;
#pragma omp simd
              for (int d = 0; d < D; ++d) {
                dqi[d] += ds * kj[d];
                dkj[d] += ds * qi[d];
                dvj[d] += pj * doi[d];
              }
            }
          }
        }
      }
    }
  }
}

#define GHT_INSTANTIATE(T)                                                                    \
  template void attention_forward<T>(T*, T*, const T*, const T*, const T*,                   \
                                     const std::int32_t*, int, int, int, int, int);          \
  template void attention_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*,    \
                                      const T*, const T*, const std::int32_t*, int, int, int, \
                                      int, int);
GHT_INSTANTIATE(float)
GHT_INSTANTIATE(double)
#undef GHT_INSTANTIATE

}  // namespace ght::kernels::cpu
