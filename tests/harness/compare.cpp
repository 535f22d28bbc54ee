#include "harness/compare.h"

#include <cmath>
#include <sstream>

namespace dsv4::test {

Diff diff(const float* got, const float* want, size_t n) {
  Diff d;
  double dot = 0.0, ng = 0.0, nw = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double e = std::fabs(double(got[i]) - double(want[i]));
    if (e > d.max_abs || std::isnan(e)) {
      if (!(d.max_abs != d.max_abs)) {  // keep the first NaN once found
        d.max_abs = e;
        d.worst = i;
      }
    }
    dot += double(got[i]) * want[i];
    ng += double(got[i]) * got[i];
    nw += double(want[i]) * want[i];
  }
  d.cosine = (ng > 0 && nw > 0) ? dot / std::sqrt(ng * nw) : (ng == nw ? 1.0 : 0.0);
  return d;
}

::testing::AssertionResult compare(const std::vector<float>& got, const std::vector<float>& want, const Tolerance& tol,
                                   const std::string& what) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " != expected " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    const bool gn = std::isnan(got[i]), wn = std::isnan(want[i]);
    const bool gi = std::isinf(got[i]), wi = std::isinf(want[i]);
    if (gn != wn || gi != wi || (gi && got[i] != want[i]))
      return ::testing::AssertionFailure() << what << ": non-finite mismatch at " << i << ": got " << got[i]
                                           << ", want " << want[i];
    if (gn || gi) continue;
    const double err = std::fabs(double(got[i]) - double(want[i]));
    if (err > tol.abs + tol.rel * std::fabs(double(want[i]))) {
      const Diff d = diff(got.data(), want.data(), got.size());
      return ::testing::AssertionFailure() << what << ": element " << i << " got " << got[i] << ", want " << want[i]
                                           << " (|diff| " << err << " > " << tol.abs << " + " << tol.rel
                                           << "·|want|); worst element " << d.worst << " diff " << d.max_abs;
    }
  }
  if (tol.min_cosine > -1.0) {
    const Diff d = diff(got.data(), want.data(), got.size());
    if (d.cosine < tol.min_cosine)
      return ::testing::AssertionFailure() << what << ": cosine " << d.cosine << " < " << tol.min_cosine;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace dsv4::test
