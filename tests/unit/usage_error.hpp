#pragma once
// The message of the UsageError that f throws; a test failure (and "") when it throws none or
// something else. Shared by the unit tests of what rejects bad input.

#include <exception>  // std::exception
#include <string>     // std::string

#include <gtest/gtest.h>  // ADD_FAILURE

#include "harness/errors.hpp"  // UsageError

template <class F>
std::string usage_error(F&& f) {
  try {
    f();
  } catch (const sb::UsageError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a UsageError: " << e.what();
    return {};
  }
  ADD_FAILURE() << "no UsageError thrown";
  return {};
}
