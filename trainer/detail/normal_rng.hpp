#pragma once
/**
 * @file normal_rng.hpp
 * @brief The deterministic standard-normal generator behind model initialisation, shared by the
 * CPU model (trainer/model.cpp) and the CUDA model (trainer/cuda/model_cuda.cpp) so that both
 * initialise bit for bit alike.
 *
 * splitmix64 + Box-Muller with one spare, independent of the C++ library
 * (std::normal_distribution is implementation-defined). It is counter-based: uniform draw k
 * (0-based) is uniform_of(mix64(seed + (k+1)·golden)), so a generator can start at any draw.
 */
#include <cmath>
#include <cstdint>
#include <numbers>

namespace ght::trainer::detail {

inline constexpr std::uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

[[nodiscard]] inline std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

/// A uniform double in [0, 1) from the top 53 bits.
[[nodiscard]] inline double uniform_of(std::uint64_t u) noexcept {
  return static_cast<double>(u >> 11) * 0x1.0p-53;
}

class NormalRng {
 public:
  explicit NormalRng(std::uint64_t seed) noexcept : s_(seed) {}
  /// Resume after `draws` uniform draws, with the Box-Muller spare state at that point.
  NormalRng(std::uint64_t seed, std::uint64_t draws, bool has_spare, double spare) noexcept
      : s_(seed + draws * kGolden), spare_(spare), has_spare_(has_spare) {}

  double next() noexcept {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u1 = 0;
    do {
      u1 = uniform();
    } while (u1 <= 0.0);
    const double u2 = uniform();
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * std::numbers::pi * u2;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  double uniform() noexcept { return uniform_of(mix64(s_ += kGolden)); }
  std::uint64_t s_;
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace ght::trainer::detail
