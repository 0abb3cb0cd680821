#pragma once
/**
 * @file expect.hpp
 * @brief GoogleTest helpers for checking error messages: the message of an expected exception,
 * and a substring expectation that prints both strings when it fails.
 */
#include <gtest/gtest.h>

#include <string>

namespace ght::test {

/// The what() of the E that `fn` must throw; a test failure (and "") when it throws nothing.
template <class E, class F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return {};
}

}  // namespace ght::test

/// EXPECT that `hay` contains `needle`, printing both when it does not.
#define EXPECT_CONTAINS(hay, needle) \
  EXPECT_NE(std::string(hay).find(needle), std::string::npos) << "'" << (hay) << "' lacks '" << (needle) << "'"
