#include "kernels/cpu/embedding.hpp"

#include <algorithm>
#include <string>

#include "kernels/cpu/detail/common.hpp"
#include "tier/error.hpp"

namespace ght::kernels::cpu {

template <class T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, std::int64_t N, int C,
                       int V) {
  // Check serially first: an exception must not escape an OpenMP region.
  for (std::int64_t i = 0; i < N; ++i) {
    GHT_EXPECTS(tokens[i] >= 0 && tokens[i] < V,
                "embedding: token id " + std::to_string(tokens[i]) + " at position " +
                    std::to_string(i) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  }
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * C))
  for (std::int64_t i = 0; i < N; ++i) {
    const T* src = wte + static_cast<std::int64_t>(tokens[i]) * C;
    std::copy(src, src + C, out + i * C);
  }
}

template <class T>
void embedding_backward(T* dwte, const T* dout, const std::int32_t* tokens, std::int64_t N, int C,
                        int /*V*/) {
  // Threads split the channels, not the tokens: two tokens with the same id would race on a row,
  // and summing in token order keeps the result independent of the thread count.
  constexpr int kCols = 16;
  const int nb = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if(detail::worth_parallel(N * C))
  for (int b = 0; b < nb; ++b) {
    const int c0 = b * kCols, c1 = std::min(C, c0 + kCols);
    for (std::int64_t i = 0; i < N; ++i) {
      T* dst = dwte + static_cast<std::int64_t>(tokens[i]) * C;
      const T* src = dout + i * C;
      for (int c = c0; c < c1; ++c) dst[c] += src[c];
    }
  }
}

template void embedding_forward<float>(float*, const std::int32_t*, const float*, std::int64_t, int,
                                       int);
template void embedding_forward<double>(double*, const std::int32_t*, const double*, std::int64_t,
                                        int, int);
template void embedding_backward<float>(float*, const float*, const std::int32_t*, std::int64_t,
                                        int, int);
template void embedding_backward<double>(double*, const double*, const std::int32_t*, std::int64_t,
                                         int, int);

}  // namespace ght::kernels::cpu
