#pragma once
/**
 * @file model_config_toml.hpp
 * @brief Load a ModelConfig from a TOML file (`ght plan --model file.toml`).
 *
 * Keys are ModelConfig's member names, at the top level or inside a [model] table (not both).
 * An optional `preset = "seed-21b"` starts from that preset; other keys override it:
 *
 *   preset = "bench-h200"
 *   name = "bench-h200-ga8"
 *   grad_accum = 8
 *
 * Integers may not be given as floats; floats accept integers. Unknown keys, wrong types and an
 * inconsistent shape are errors naming the file and the key.
 */
#include <string>

#include "trainer/model_config.hpp"

namespace ght::trainer {

/// @throws ght::io_error naming the file (and the key) when it cannot be read, parsed or is invalid.
[[nodiscard]] ModelConfig load_model_config(const std::string& path);

}  // namespace ght::trainer
