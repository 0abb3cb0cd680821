#pragma once
/**
 * @file registry.hpp
 * @brief Configuration registries for tests: a synthetic environment for Registry::load(), and a
 * registry loaded from one.
 */
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "tier/config.hpp"

namespace ght::test {

/// A synthetic environment (NAME=VALUE strings kept alive, plus the null terminator).
class Env {
 public:
  Env(std::initializer_list<std::string> vars) : vars_(vars) { point(); }
  explicit Env(std::vector<std::string> vars) : vars_(std::move(vars)) { point(); }
  char** get() { return ptrs_.data(); }

 private:
  void point() {
    for (auto& v : vars_) ptrs_.push_back(v.data());
    ptrs_.push_back(nullptr);
  }
  std::vector<std::string> vars_;
  std::vector<char*> ptrs_;
};

/// Sets one GHT_* option of the process-wide registry as a flag for a scope, and puts its
/// previous value back when the scope ends (a failed assertion included).
class ScopedFlag {
 public:
  ScopedFlag(std::string name, const std::string& value)
      : name_(std::move(name)), saved_(config::cfg().text(config::find_option(name_)->key)) {
    config::cfg().set_flag(name_, value);
  }
  ~ScopedFlag() { config::cfg().set_flag(name_, saved_); }
  ScopedFlag(const ScopedFlag&) = delete;
  ScopedFlag& operator=(const ScopedFlag&) = delete;

 private:
  std::string name_, saved_;
};

/// A registry loaded from exactly these variables (the process environment is not read).
inline config::Registry registry_with(std::vector<std::string> env) {
  Env e(std::move(env));
  config::Registry reg;
  reg.load(e.get());
  return reg;
}

}  // namespace ght::test
