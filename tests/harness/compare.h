// One comparison for every numeric test: NaN/Inf positions must match, each element within
// abs + rel·|want|, optionally a whole-tensor cosine bound; failures name the worst element and both values.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <string>
#include <vector>

namespace dsv4::test {

struct Tolerance {
  double abs = 0.0;
  double rel = 0.0;
  double min_cosine = -1.0;  // −1 disables the cosine check
};

struct Diff {
  double max_abs = 0.0;  // largest |got − want|
  size_t worst = 0;      // its index
  double cosine = 1.0;
};

Diff diff(const float* got, const float* want, size_t n);

::testing::AssertionResult compare(const std::vector<float>& got, const std::vector<float>& want, const Tolerance& tol,
                                   const std::string& what = "");

}  // namespace dsv4::test
