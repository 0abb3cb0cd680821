#pragma once
/**
 * @file regions_json.hpp
 * @brief Regions as JSON, so that other trainers can describe their tensors to the engine
 * (`ght plan --regions file.json`). Plan::to_json / Plan::from_json use the same encoding.
 *
 *   {"step_flops": 7.8e14,                       // optional: FLOPs per step (overlap window)
 *    "regions": [
 *      {"name": "layer0.attn.master", "class": "master", "bytes": 201326592,
 *       "group": "attention",                    // optional, default: the class name
 *       "host_bytes": 201326592,                 // optional, default: bytes
 *       "access": [{"what": "optimizer", "gpu_read_bytes": 201326592,
 *                   "gpu_write_bytes": 201326592, "times_per_step": 1,
 *                   "overlappable": true, "window_fraction": 0.125,
 *                   "gpu_path": "kernel", "routing_tokens": 0}],
 *       "host_access": [...],                    // optional: replaces access on the host
 *       "hbm_allowed": true, "host_allowed": true,
 *       "recompute_bytes": 33554432,             // optional: can be recomputed
 *       "recompute_flops": 1.2e12, "layer": 0, "expert": -1, "routing_frequency": 0}]}
 *
 * Every key but name, class and bytes is optional (defaults as in plan.hpp). Unknown keys,
 * wrong types and negative sizes are errors naming the file and the key's path.
 */
#include <optional>
#include <string>
#include <vector>

#include "tier/plan.hpp"

namespace ght::tier {

/// Regions and the step size they come with.
struct RegionSet {
  std::vector<Region> regions;
  double step_flops = 0;
};

/// Compact JSON: keys equal to their defaults are left out (parsing restores them exactly).
[[nodiscard]] std::string regions_to_json(const std::vector<Region>& regions, double step_flops = 0);
/// @throws ght::io_error naming `origin` and the offending key path.
[[nodiscard]] RegionSet regions_from_json(const std::string& text, const std::string& origin);
/// Read a file and parse it. @throws ght::io_error naming the path.
[[nodiscard]] RegionSet load_regions_file(const std::string& path);

/// Warm-up counts for the auto policy:
///   {"step_tokens": 32768,
///    "expert_tokens": [{"layer": 0, "expert": 3, "tokens": 2100}, ...],
///    "link_bytes": [{"region": "layer0.expert3.grad", "h2d_bytes": 0, "d2h_bytes": 3.1e8}, ...],
///    "phases": {"step_flops": 6.2e15, "recompute_flops": 0, "forward_seconds": 3.9,
///               "backward_seconds": 10.7}}
/// Every part is optional; phases need step_flops, forward_seconds and backward_seconds
/// (MeasuredPhases, calibrate_compute).
[[nodiscard]] std::string measurements_to_json(const Measurements& m);
/// @throws ght::io_error naming `origin` and the offending key path.
[[nodiscard]] Measurements measurements_from_json(const std::string& text, const std::string& origin);
/// Read a file and parse it. @throws ght::io_error naming the path.
[[nodiscard]] Measurements load_measurements_file(const std::string& path);
/// The file GHT_PLAN_MEASUREMENTS names, read (errors name the option and the file); none when
/// the option is empty.
[[nodiscard]] std::optional<Measurements> configured_measurements();

}  // namespace ght::tier
