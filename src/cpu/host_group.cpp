#include "cpu/host_group.h"

#include <algorithm>

#include "core/error.h"

namespace dsv4 {

HostGroup::HostGroup(int ranks) : inputs_(size_t(ranks), nullptr) { DSV4_ASSERT(ranks >= 1); }

void HostGroup::arrive(size_t sum_size) {
  std::unique_lock lock(mutex_);
  DSV4_CHECK(!aborted_, "another rank of this model failed; the model cannot run further");
  const uint64_t phase = phase_;
  if (++arrived_ == ranks()) {
    // Every rank is here, so none is reading sum_: the last to arrive may grow it.
    if (sum_.size() < sum_size) sum_.resize(sum_size);
    arrived_ = 0;
    ++phase_;
    all_here_.notify_all();
    return;
  }
  all_here_.wait(lock, [&] { return phase_ != phase || aborted_; });
  DSV4_CHECK(!aborted_, "another rank of this model failed; the model cannot run further");
}

void HostGroup::abort() {
  std::lock_guard lock(mutex_);
  aborted_ = true;
  all_here_.notify_all();
}

void HostGroup::all_reduce(int rank, float* x, size_t count) {
  const size_t n = size_t(ranks());
  if (n == 1) return;
  inputs_[size_t(rank)] = x;
  arrive(count);  // every x is in place, every rank has copied the last sum out, and sum_ holds count
  // Each rank sums its slice of the elements over all ranks' inputs.
  const size_t per = (count + n - 1) / n, i0 = std::min(count, size_t(rank) * per), i1 = std::min(count, i0 + per);
  for (size_t i = i0; i < i1; ++i) {
    float s = inputs_[0][i];
    for (size_t r = 1; r < n; ++r) s += inputs_[r][i];
    sum_[i] = s;
  }
  arrive();  // every slice is summed; no rank reads the inputs again
  std::copy_n(sum_.data(), count, x);
}

}  // namespace dsv4
